"""End to end on a tiny REAL sweep: scripts/train.py -m over 2 ladder steps x 2 seeds on a slice of
Multi30k, then scripts/compare.py and notebooks/compare_2017_vs_llama.ipynb (nbclient) on it, the
notebook's branch section on the committed branch runs."""

from __future__ import annotations

import csv
import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, SHARED_DATA
from tests.training.conftest import SIZES, small_cli_args

pytestmark = pytest.mark.slow

STEPS = ("step0_vaswani2017", "step6_decoder_only")
# Faster than small_cli_args: 4 updates, no validation BLEU, greedy decoding.
FAST = {"train.max_updates": "4", "train.validate_every": "2", "train.valid_bleu": "false", "generation.beam_size": "1"}


def _sweep_args(corpus: Path, sweep_dir: Path) -> list[str]:
    args = [a for a in small_cli_args(corpus, sweep_dir) if not a.startswith("run_dir=")]  # one folder per job
    args = [a for a in args if a.split("=", 1)[0] not in FAST]
    return args + [f"{k}={v}" for k, v in FAST.items()] + [f"hydra.sweep.dir={sweep_dir}"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory) -> Path:
    if not (SHARED_DATA / "multi30k" / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found under {SHARED_DATA}")
    corpus = tmp_path_factory.mktemp("corpus")
    for split, n in SIZES.items():
        for lang in ("en", "de"):
            with gzip.open(SHARED_DATA / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                (corpus / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    sweep = tmp_path_factory.mktemp("multirun") / "ladder"
    cmd = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "train.py"),
        "-m",
        "experiment=ladder",
        "seed=1,2",
        f"ladder={','.join(STEPS)}",
        *_sweep_args(corpus, sweep),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(sweep.glob("*/results.json"))) == 4, proc.stderr[-3000:]
    return sweep


def test_compare_cli_on_a_real_sweep(real_sweep, tmp_path):
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "compare.py"),
            str(real_sweep),
            "--out",
            str(out),
            "--bootstrap",
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert [r["label"] for r in rows] == list(STEPS)
    assert [r["n_runs"] for r in rows] == ["2", "2"] and [r["seeds"] for r in rows] == ["1 2", "1 2"]
    assert rows[0]["is_baseline"] == "True" and rows[0]["p_value"] == ""
    assert 0 < float(rows[1]["p_value"]) <= 1 and len(rows[1]["p_value_seeds"].split()) == 2
    assert int(rows[0]["params"]) > 0 and float(rows[1]["flops_per_token"]) > 0
    assert int(rows[1]["kv_cache_bytes_per_token"]) > 0 and float(rows[0]["train_tokens_per_s"]) > 0
    # four updates train nothing: a row under 1 BLEU is marked untrained, out of the Holm family
    assert [r["untrained"] for r in rows] == [str(float(r["bleu_mean"]) < 1.0) for r in rows]
    assert f"| step6_decoder_only{_untrained(rows[1])} | 2/2 |" in proc.stdout
    assert "None: every run finished." in proc.stdout
    assert (out / "valid_curves.png").stat().st_size > 5000 and (out / "bleu_bars.png").stat().st_size > 5000


def _untrained(row: dict) -> str:
    """The mark of an untrained row in comparison.md's first column (BLEU under 1: four updates)."""
    return " (untrained)" if row["untrained"] in (True, "True") else ""


def test_notebook_runs_on_a_real_sweep(real_sweep, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb_path = REPO_ROOT / "notebooks" / "compare_2017_vs_llama.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "from transformer.analysis import" in text and "def compare_sweeps" not in text  # no copied code
    out = tmp_path / "nb_out"
    branches = tmp_path / "branches_out"  # the branch section reads the committed branch runs, writes here
    for key, value in {
        "SWEEP_DIR": str(real_sweep),
        "COMPARE_OUT": str(out),
        "BRANCH_OUT": str(branches),
        "N_BOOTSTRAP": "100",
        **_env(),
    }.items():
        monkeypatch.setenv(key, value)  # the kernel inherits the environment
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}}
    )
    client.execute()
    nbformat.write(nb, tmp_path / "executed.ipynb")  # kept for inspection when a later assert fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    markdown = "\n".join(o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {}))
    rows = list(csv.DictReader((tmp_path / "nb_out" / "comparison.csv").open()))
    assert f"| step0_vaswani2017 (baseline){_untrained(rows[0])} | 2/2 |" in markdown
    assert f"| step6_decoder_only{_untrained(rows[1])} | 2/2 |" in markdown
    assert "**step6_decoder_only** vs **step0_vaswani2017**" in markdown
    assert "| step5_gqa (baseline) | 2/2 |" in markdown and "| step5_mla | 2/2 |" in markdown  # the branches
    assert "ΔBLEU against the baseline [paired 95% interval]" in markdown  # ... by reference length
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4
    assert {p.name for p in branches.iterdir()} >= {"comparison.md", "length_buckets.csv", "bleu_by_length.png"}
    assert {p.name for p in out.iterdir()} >= {"comparison.md", "comparison.csv", "valid_curves.png", "bleu_bars.png"}
