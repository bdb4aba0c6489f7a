"""scripts/export.py: exports and imports through the Hydra app, and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.generation.helpers import REPO_ROOT, load_script, make_run_dir
from tests.generation.helpers import compose_script_config as _cfg
from tests.interop.helpers import LLAMA
from transformer.generation import load_run


def test_export_hf_then_import_back(tmp_path) -> None:
    pytest.importorskip("transformers")
    dec = {k: v for k, v in LLAMA.items() if k not in ("arch", "n_encoder_layers")}
    run_dir, model, _, _ = make_run_dir(tmp_path / "run", arch="decoder_only", **dec)
    script = load_script("export")
    hf_dir = script.run(_cfg("export", [f"run={run_dir}", "format=hf", f"out={tmp_path / 'hf'}"]))
    back = script.run(_cfg("export", [f"run={hf_dir}", "format=zoo", f"out={tmp_path / 'back'}"]))
    tokens = torch.tensor([[7, 8, 9, 4, 10, 11]])
    with torch.no_grad():
        torch.testing.assert_close(load_run(back).model(tokens), model(tokens), atol=1e-5, rtol=0)


def test_refused_export_exits_2_with_one_line(tmp_path) -> None:
    run_dir = make_run_dir(tmp_path / "run", **{"position.name": "alibi"})[0]
    res = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "export.py"),
            f"run={run_dir}",
            "format=ctranslate2",
            f"out={tmp_path / 'ct2'}",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: cannot export to CTranslate2: model/position=alibi in an encoder-decoder: CTranslate2 has ALiBi "
        "only in decoders (its encoder has no ALiBi bias)"
    ]
    assert not (tmp_path / "ct2").exists()
