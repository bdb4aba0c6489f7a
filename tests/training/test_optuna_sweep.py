"""Sweeps that search on validation: ``hydra/sweeper=optuna`` drives
``scripts/train.py``, whose return value is the best validation ``train.best_metric`` (never a test
score); a diverged trial is a failed trial, not a 0; a direction that does not fit the metric is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO_ROOT
from tests.training.conftest import small_cli_args

pytestmark = pytest.mark.slow


def _search_config(folder: Path, direction: str, metric: str) -> Path:
    """A config folder (for hydra.searchpath) with hparams_search/test.yaml: 3 trials over optim.lr,
    one of which (1e6) diverges. (Optuna's GridSampler would be the natural choice, but with the
    plugin's ask-and-tell loop it calls ``Study.stop`` outside an objective when the grid is done.)"""
    (folder / "hparams_search").mkdir(parents=True)
    (folder / "hparams_search" / "test.yaml").write_text(
        textwrap.dedent(f"""\
        # @package _global_
        defaults:
          - override /hydra/sweeper: optuna
          - override /hydra/sweeper/sampler: random
        train:
          best_metric: {metric}
        hydra:
          sweeper:
            direction: {direction}
            n_trials: 3
            n_jobs: 1
            max_failure_rate: 1.0
            sampler:
              seed: 1   # optuna 2.10's RandomSampler(seed=1) draws each of the 3 values once
            params:
              optim.lr: choice(1e-3, 3e-3, 1e6)
        """)
    )
    return folder


def _sweep(corpus: Path, tmp_path: Path, direction: str, metric: str) -> tuple[subprocess.CompletedProcess, Path]:
    sweep = tmp_path / "sweep"
    args = [
        a
        for a in small_cli_args(corpus, sweep, "train.max_updates=3", "train.validate_every=0", "lr_scheduler=constant")
        if not a.startswith("run_dir=")
    ]
    cmd = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "train.py"),
        "-m",
        "hparams_search=test",
        f"hydra.searchpath=[file://{_search_config(tmp_path / 'conf', direction, metric)}]",
        f"hydra.sweep.dir={sweep}",
        *args,
    ]
    res = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    return res, sweep


def test_optuna_optimises_the_best_validation_loss_and_records_a_diverged_trial_as_failed(small_corpus, tmp_path):
    res, sweep = _sweep(small_corpus, tmp_path, "minimize", "loss")
    assert res.returncode == 0, res.stderr[-3000:]
    trials = {}
    for run in sweep.iterdir():
        if (run / ".hydra" / "overrides.yaml").is_file():
            lr = next(o for o in OmegaConf.load(run / ".hydra" / "overrides.yaml") if o.startswith("optim.lr="))
            trials[float(lr.split("=")[1])] = (
                json.loads((run / "results.json").read_text()) if (run / "results.json").is_file() else None
            )
    assert sorted(trials) == [1e-3, 3e-3, 1e6]  # the grid: every value once
    assert trials[1e6] is None and "training diverged" in res.stderr  # the diverged trial wrote no results
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    finished = {lr: r for lr, r in trials.items() if r is not None}
    best_lr = min(finished, key=lambda lr: finished[lr]["best_valid"])
    # the study's best is the lowest best VALIDATION loss among the finished trials: not the failed
    # trial (as a 0 would be when minimising), not a test score
    assert best.best_value == pytest.approx(finished[best_lr]["best_valid"]) and best.best_value > 1.0
    assert float(best.best_params["optim.lr"]) == best_lr
    assert all(r["best_metric"] == "loss" for r in finished.values())


def test_a_direction_that_does_not_fit_the_metric_is_refused_before_training(small_corpus, tmp_path):
    res, sweep = _sweep(small_corpus, tmp_path, "minimize", "bleu")
    assert res.returncode != 0
    assert (
        "error: invalid configuration: hydra.sweeper.direction=minimize but train.best_metric=bleu (the "
        "objective each trial returns) is optimised by maximize"
    ) in res.stderr
    assert not list(sweep.glob("*/metrics.jsonl"))  # no trial trained
