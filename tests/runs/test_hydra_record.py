"""Hydra's record of a job (transformer/runs/hydra_record.py): a run refused before training leaves no
folder behind, a folder that held anything else is left alone, and the record's
names and choices are read back."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.conftest import REPO_ROOT
from tests.faults.conftest import run_script
from transformer.runs.hydra_record import (
    RESUME_RECORD,
    forget_record,
    job_choices,
    job_run_dir,
    record_subdir,
    recorded_choices,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": ""}


def _train(*args: str) -> subprocess.CompletedProcess:
    return run_script("train", *args, cwd=REPO_ROOT, env=ENV)


def test_a_refused_run_leaves_no_folder_and_one_that_held_files_keeps_them(tmp_path):
    fresh, used = tmp_path / "fresh", tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine\n")
    for folder in (fresh, used):
        proc = _train("model.n_heads=3", "train.max_updates=1", f"hydra.run.dir={folder}")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "error: invalid configuration: model.d_model=256 is not divisible by model.n_heads=3"
        ]
    assert not fresh.exists()
    assert (used / "notes.txt").read_text() == "mine\n"


def test_a_flat_group_override_is_refused_before_hydra_makes_a_folder(tmp_path):
    proc = _train("model.attention=gqa", "train.max_updates=1", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and "model/attention=gqa" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_record_names_and_reading_back(tmp_path):
    assert record_subdir(False, tmp_path) == ".hydra"
    assert record_subdir(True, tmp_path).startswith(RESUME_RECORD)
    assert time.strftime("%Y-%m-%d") in record_subdir(True)
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "hydra.yaml").write_text(
        "hydra:\n  runtime:\n    choices:\n      model: transformer_tiny\n      model/ffn: relu\n"
        "      hydra/launcher: basic\n      data: null\n"
    )
    assert recorded_choices(tmp_path) == {"model": "transformer_tiny", "model/ffn": "relu"}
    assert recorded_choices(tmp_path / "missing") is None
    # outside a Hydra job: no run folder, no choices, nothing to take back
    assert job_run_dir() is None and job_choices() == {} and forget_record() is None


def test_a_refused_run_in_hydras_dated_folder_leaves_no_outputs_folder(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), "model.n_heads=3", "train.max_updates=1"],
        cwd=tmp_path,  # Hydra's default outputs/default/<date>/ under it
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the run folder nor outputs/default/
