"""``train.finished_runs``: a run finished on another machine is recognised only when it trained
exactly this job (transformer/training/job/finished_runs.py). The sweep-level behaviour (a fresh sweep
folder skips the finished runs and trains the rest exactly) is in ``test_study_resume.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from transformer.config import Config, ConfigError, config_dict, to_config
from transformer.training.job.finished_runs import finished_twin, skip_if_finished_elsewhere


def _config(finished: Path, **train) -> Config:
    cfg = OmegaConf.structured(Config)
    cfg.train.finished_runs = str(finished)
    cfg.train.precision = "fp32"
    for key, value in train.items():
        cfg.train[key] = value
    return to_config(cfg)


def _commit(folder: Path, cfg: Config, **results) -> Path:
    """A finished run's results.json as ``scripts/train.py`` writes it (the fields read here)."""
    folder.mkdir(parents=True)
    record = {
        "config": config_dict(cfg),
        "precision": "fp32",
        "updates": 6000,
        "bleu": 38.9,
        "device": "cpu",
        "world_size": 1,
        "hardware": {"torch": torch.__version__},
        **results,
    }
    (folder / "results.json").write_text(json.dumps(record))
    return folder


def test_the_twin_of_the_same_config_is_found_by_the_run_folder_name(tmp_path):
    cfg = _config(tmp_path / "runs")
    twin = _commit(tmp_path / "runs" / "step0_seed2", cfg)
    path, results, why = finished_twin(cfg, tmp_path / "elsewhere" / "step0_seed2")
    assert (path, results["bleu"], why) == (twin / "results.json", 38.9, "")
    done = skip_if_finished_elsewhere(cfg, tmp_path / "elsewhere" / "step0_seed2", has_checkpoint=False)
    assert done["skipped_complete"] is True and done["finished_in"] == str(twin)
    # paths, threads, logging and how it resumes are not part of what a run computes
    moved = _config(tmp_path / "runs", num_threads=2, progress=False, resume="auto", log_every=7)
    assert finished_twin(moved, tmp_path / "step0_seed2")[2] == ""
    # a folder that is itself one run's
    assert finished_twin(_config(twin), tmp_path / "anything")[0] == twin / "results.json"


def test_a_twin_that_trained_differently_is_not_taken_and_the_sentence_names_the_fields(tmp_path, capsys):
    cfg = _config(tmp_path / "runs")
    _commit(tmp_path / "runs" / "run", cfg)
    other_seed = to_config(OmegaConf.merge(OmegaConf.structured(cfg), {"seed": 2}))
    assert "seed (1 there, 2 here)" in finished_twin(other_seed, tmp_path / "run")[2]
    longer = _config(tmp_path / "runs", max_updates=8000)
    assert "train.max_updates (0 there, 8000 here)" in finished_twin(longer, tmp_path / "run")[2]
    assert skip_if_finished_elsewhere(longer, tmp_path / "run", has_checkpoint=False) is None
    assert "train.finished_runs: " in capsys.readouterr().err

    _commit(tmp_path / "bf16" / "run", cfg, precision="bf16")
    assert "precision ('bf16' there, 'fp32' here)" in finished_twin(_config(tmp_path / "bf16"), tmp_path / "run")[2]
    _commit(tmp_path / "old" / "run", cfg, hardware={"torch": "2.0.0"})
    assert "torch ('2.0.0' there" in finished_twin(_config(tmp_path / "old"), tmp_path / "run")[2]
    # max_tokens is per process: a run of two processes saw twice the tokens per update
    _commit(tmp_path / "ddp" / "run", cfg, world_size=2)
    assert "processes (2 there, 1 here" in finished_twin(_config(tmp_path / "ddp"), tmp_path / "run")[2]
    _commit(tmp_path / "gpu" / "run", cfg, device="cuda:0")
    assert (
        "device ('cuda:0' there, 'cpu' here)"
        in finished_twin(_config(tmp_path / "gpu", device="cpu"), tmp_path / "run")[2]
    )


def test_no_twin_or_an_unreadable_one_trains(tmp_path):
    cfg = _config(tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    assert finished_twin(cfg, tmp_path / "run")[1] is None
    (tmp_path / "runs" / "run").mkdir(parents=True)
    (tmp_path / "runs" / "run" / "results.json").write_text("{truncated")
    assert "cannot be read" in finished_twin(cfg, tmp_path / "run")[2]
    off = _config(tmp_path / "runs")
    off.train.finished_runs = None
    assert skip_if_finished_elsewhere(off, tmp_path / "run", has_checkpoint=False) is None


def test_a_run_folder_with_a_checkpoint_of_its_own_is_never_skipped(tmp_path):
    """Whatever ``train.resume`` does with it, a run started here is this folder's."""
    cfg = _config(tmp_path / "runs")
    _commit(tmp_path / "runs" / "run", cfg)
    assert skip_if_finished_elsewhere(cfg, tmp_path / "run", has_checkpoint=True) is None
    assert skip_if_finished_elsewhere(cfg, tmp_path / "run", has_checkpoint=False) is not None


def test_a_folder_that_does_not_exist_is_a_config_error_naming_the_field(tmp_path, monkeypatch):
    """A typo must not quietly train every run again."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(Path("docs/results/ladder/runz"))
    with pytest.raises(
        ConfigError,
        match=r"train.finished_runs=docs/results/ladder/runz: there is no folder "
        + str(tmp_path / "docs/results/ladder/runz"),
    ):
        skip_if_finished_elsewhere(cfg, tmp_path / "run", has_checkpoint=False)
