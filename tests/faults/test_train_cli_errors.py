"""``scripts/train.py`` reports user errors (here a checkpoint that cannot be
resumed) as one line, with the traceback only under ``HYDRA_FULL_ERROR=1``, and no message ever
suggests ``weights_only=False``."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.faults.conftest import run_script, small_cli_args


class _NotPlain:
    """An object ``torch.load(weights_only=True)`` refuses."""


@pytest.fixture
def poisoned_run(trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    torch.save({"format": "x", "evil": _NotPlain()}, run / "checkpoint_last.pt")
    return run


def _resume(corpus, run, tmp_path, env=None):
    return run_script(
        "train",
        *small_cli_args(corpus, run, f"hydra.run.dir={run}", "train.resume=true", "train.max_updates=8"),
        cwd=tmp_path,
        env=env,
    )


def test_unreadable_checkpoint_at_resume_is_one_line(poisoned_run, gappy_corpus, tmp_path):
    res = _resume(gappy_corpus, poisoned_run, tmp_path)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "checkpoint_last.pt" in errors[0]
    assert "weights_only" not in res.stderr.replace("weights_only=True", "")  # never torch's advice to unpickle
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    full = _resume(gappy_corpus, poisoned_run, tmp_path, env=env)
    assert full.returncode == 1 and "Traceback" in full.stderr and "CheckpointError" in full.stderr
