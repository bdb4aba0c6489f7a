"""Ranks from submitit's job environment (SLURM through hydra/launcher=submitit_slurm, no torchrun)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.training.conftest import small_cli_args
from transformer.training.distributed.process_group import export_submitit_environment

TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for key in (*TORCHRUN_VARS, "SUBMITIT_EXECUTOR", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(key, "")  # remembered, so what the test exports is undone afterwards
        monkeypatch.delenv(key)
    return monkeypatch


def test_slurm_task_gets_torchrun_variables(clean_env):
    """Task 5 of 8 (2 nodes x 4 tasks, on the second node) of SLURM job 4242 started by submitit."""
    slurm = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": "8",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
    }
    for key, value in slurm.items():
        clean_env.setenv(key, value)
    assert export_submitit_environment() is True
    got = {key: os.environ[key] for key in TORCHRUN_VARS}
    port = int(got.pop("MASTER_PORT"))
    assert got == {"MASTER_ADDR": "gpu07", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert 20000 <= port <= 60000  # from the job id: the same on every task
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # each task picks the GPU LOCAL_RANK itself


def test_torchrun_or_no_submitit_leaves_the_environment(clean_env):
    assert export_submitit_environment() is False  # a plain process
    clean_env.setenv("SUBMITIT_EXECUTOR", "slurm")
    clean_env.setenv("WORLD_SIZE", "2")  # torchrun inside a SLURM job: torchrun's ranks win
    assert export_submitit_environment() is False
    assert "RANK" not in os.environ


def test_submitit_local_two_tasks_train_as_two_ranks(small_corpus, tmp_path):
    """hydra/launcher=submitit_local with 2 tasks: one run folder, 2 gloo ranks (world_size 2)."""
    sweep = tmp_path / "sweep"
    args = [a for a in small_cli_args(small_corpus, tmp_path / "unused") if not a.startswith("run_dir=")]
    cmd = [
        sys.executable,
        "scripts/train.py",
        "-m",
        *args,
        "train.max_updates=2",
        "train.validate_every=0",
        "train.valid_bleu=false",
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        f"hydra.sweep.dir={sweep}",
    ]
    out = subprocess.run(
        cmd, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    logs = "\n".join(p.read_text() for p in sorted(sweep.glob(".submitit/*/*_log.err")))
    assert out.returncode == 0, out.stderr[-2000:] + logs[-3000:]
    results = json.loads((sweep / "0" / "results.json").read_text())
    assert results["world_size"] == 2 and results["updates"] == 2 and results["bleu"] is not None
