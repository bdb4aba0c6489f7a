"""scripts/average_checkpoints.py: averaging by value, from a folder and from files, CLI errors."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from transformer.training.checkpoint import CheckpointManager
from transformer.training.checkpoint.averaging import resolve_inputs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "average_checkpoints.py"


def _script():
    spec = importlib.util.spec_from_file_location("average_checkpoints_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_dir(tmp_path):
    """Numbered checkpoints at updates 10..40 with w = update / 10, an fp16 bias and a tied pair."""
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=0)
    for update in (10, 20, 30, 40):
        shared = torch.full((2, 3), update / 10)
        state = {"embed.weight": shared, "out.weight": shared, "b": torch.tensor([update, 1.0], dtype=torch.float16)}
        mgr.save(update, state, {"update": update}, numbered=True)
    return mgr.run_dir


def test_cli_folder_last_three_by_value(run_dir, tmp_path):
    out = tmp_path / "avg.safetensors"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--inputs", str(run_dir), "--num-last", "3", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "averaged 3 checkpoints (checkpoint_20, checkpoint_30, checkpoint_40)" in proc.stdout
    avg = load_file(out)
    torch.testing.assert_close(avg["embed.weight"], torch.full((2, 3), 3.0))  # (2 + 3 + 4) / 3
    torch.testing.assert_close(avg["out.weight"], torch.full((2, 3), 3.0))
    assert avg["b"].dtype == torch.float16
    torch.testing.assert_close(avg["b"], torch.tensor([30.0, 1.0], dtype=torch.float16))
    with safe_open(str(out), framework="pt") as f:
        sources = json.loads(f.metadata()["averaged_from"])
    assert [Path(s).name for s in sources] == ["checkpoint_20", "checkpoint_30", "checkpoint_40"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_explicit_files_in_process(run_dir, tmp_path):
    out = _script().main(
        [
            "--inputs",
            str(run_dir / "checkpoint_10.safetensors"),
            str(run_dir / "checkpoint_40"),
            "--output",
            str(tmp_path / "two.safetensors"),
        ]
    )
    torch.testing.assert_close(load_file(out)["embed.weight"], torch.full((2, 3), 2.5))


def test_num_last_above_what_exists_averages_all_with_a_warning(run_dir, tmp_path, capsys):
    out = _script().main(["--inputs", str(run_dir), "--num-last", "5", "--output", str(tmp_path / "x.safetensors")])
    assert "warning: --num-last=5 but" in capsys.readouterr().err
    torch.testing.assert_close(load_file(out)["embed.weight"], torch.full((2, 3), 2.5))  # (1 + 2 + 3 + 4) / 4


def test_errors(run_dir, tmp_path):
    with pytest.raises(ValueError, match=r"no checkpoints to average.*train\.save_every"):
        resolve_inputs([tmp_path], None)  # a folder without checkpoint_{update} files
    with pytest.raises(ValueError, match="not both"):
        resolve_inputs([run_dir, run_dir / "checkpoint_10"], None)
    assert not (tmp_path / "x.safetensors").exists()
