"""transformer.training.checkpoint.averaging (the work of scripts/average_checkpoints.py), called
in-process: which checkpoints are picked, the averaged values, the metadata naming the run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from transformer.training.checkpoint import CheckpointManager, write_average
from transformer.training.checkpoint.averaging import resolve_inputs, source_run


@pytest.fixture
def run_dir(tmp_path):
    """A run folder (config.yaml) with numbered checkpoints at updates 10..40 holding w = update / 10,
    plus checkpoint_best and checkpoint_last."""
    mgr = CheckpointManager(tmp_path / "run", keep_last=0)
    for update in (10, 20, 30, 40):
        state = {"w": torch.full((2, 3), update / 10), "n": torch.tensor([update])}
        mgr.save(update, state, {"update": update}, numbered=True)
    mgr.save(40, {"w": torch.zeros(2, 3), "n": torch.tensor([0])}, {"update": 40}, is_best=True)
    (mgr.run_dir / "config.yaml").write_text("seed: 1\n")
    return mgr.run_dir


def _metadata(path):
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def test_the_last_n_of_a_run_are_averaged_and_the_run_recorded(run_dir, tmp_path, capsys):
    out = write_average([run_dir], tmp_path / "elsewhere" / "avg.safetensors", 2)
    assert out == tmp_path / "elsewhere" / "avg.safetensors"
    avg = load_file(out)
    torch.testing.assert_close(avg["w"], torch.full((2, 3), 3.5))  # (3 + 4) / 2
    assert avg["n"].tolist() == [40]  # integer tensors: the last checkpoint's
    meta = _metadata(out)
    assert [p.split("/")[-1] for p in json.loads(meta["averaged_from"])] == ["checkpoint_30", "checkpoint_40"]
    assert meta["source_run"] == str(run_dir.resolve())  # translate/evaluate find the run from anywhere
    assert capsys.readouterr().out == f"averaged 2 checkpoints (checkpoint_30, checkpoint_40) into {out}\n"


def test_fewer_than_asked_are_all_averaged_with_a_warning(run_dir, capsys):
    paths = resolve_inputs([run_dir], 9, warn_prefix="tool: warning: ")
    assert [p.name for p in paths] == ["checkpoint_10", "checkpoint_20", "checkpoint_30", "checkpoint_40"]
    assert capsys.readouterr().err.startswith("tool: warning: --num-last=9 but ")


def test_files_are_used_as_given_and_without_a_run_no_source_is_recorded(run_dir, tmp_path):
    files = [run_dir / "checkpoint_40.safetensors", run_dir / "checkpoint_10", run_dir / "checkpoint_20"]
    assert resolve_inputs(files, 2) == files[1:]  # the last 2 by position, not by update
    assert resolve_inputs(files, None) == files
    (run_dir / "config.yaml").unlink()
    assert source_run(files) is None
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")
    assert source_run(files) == run_dir.resolve()
    (run_dir / ".hydra" / "config.yaml").unlink()
    out = write_average(files[:2], tmp_path / "two.safetensors")
    torch.testing.assert_close(load_file(out)["w"], torch.full((2, 3), 2.5))
    assert "source_run" not in _metadata(out)


def test_nothing_to_average_says_why(run_dir, tmp_path):
    with pytest.raises(ValueError, match=r"--num-last=0 must be >= 1"):
        resolve_inputs([run_dir], 0)
    for f in run_dir.glob("checkpoint_[0-9]*"):
        f.unlink()
    with pytest.raises(
        ValueError,
        match=r"has no numbered checkpoint_<update> files "
        r"\(it holds checkpoint_best, checkpoint_last\)\. "
        r"Training writes them only with train\.save_every=N",
    ):
        write_average([run_dir], tmp_path / "avg.safetensors")
    with pytest.raises(ValueError, match="no checkpoints to average: --inputs lists 0 checkpoints"):
        resolve_inputs([], None)
    assert not (tmp_path / "avg.safetensors").exists()
