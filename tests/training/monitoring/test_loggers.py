"""Metrics loggers: JSONL rows and resume, wandb offline run folder, TensorBoard event file."""

import json
import math
import time

import pytest
import torch

from transformer.config import LoggerConfig
from transformer.training.monitoring.loggers import (
    JsonlLogger,
    MultiLogger,
    TensorboardLogger,
    WandbLogger,
    build_loggers,
)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_jsonl_rows_and_append_on_resume(tmp_path):
    logger = JsonlLogger(tmp_path)
    logger.log({"loss": torch.tensor(2.5), "lr": 5e-4, "note": "x"}, step=10, split="train")
    logger.log({"loss": float("nan")}, step=20, split="valid")
    logger.close()
    # a crash mid-row leaves a partial line; the resumed logger terminates it and appends
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"split": "train", "upd')
    resumed = JsonlLogger(tmp_path)
    resumed.log({"loss": 2.0}, step=30, split="train")
    resumed.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4 and lines[2].startswith('{"split": "train", "upd')
    rows = [json.loads(line) for i, line in enumerate(lines) if i != 2]
    assert list(rows[0]) == ["split", "update", "loss", "lr", "note", "time"]
    assert rows[0]["split"] == "train" and rows[0]["update"] == 10 and rows[0]["loss"] == 2.5
    assert abs(rows[0]["time"] - time.time()) < 60
    assert rows[1]["split"] == "valid" and math.isnan(rows[1]["loss"])
    assert rows[2]["update"] == 30
    with pytest.raises(ValueError, match="reserved"):
        JsonlLogger(tmp_path).log({"update": 1}, step=1, split="train")


def test_wandb_offline_writes_a_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    start = time.monotonic()
    loggers = build_loggers(
        LoggerConfig(name="wandb", project="zoo-test", mode="offline"),
        tmp_path,
        "tiny",
        {"model": {"d_model": 8}},
        is_main=True,
    )
    loggers.log({"loss": 3.0, "lr": torch.tensor(1e-3)}, step=1, split="train")
    loggers.log({"bleu": 10.0}, step=1, split="valid")
    wandb_logger = loggers.loggers[1]
    assert isinstance(wandb_logger, WandbLogger)
    run_path = wandb_logger.run_path
    loggers.close()
    assert time.monotonic() - start < 30
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs == [run_path]
    assert list(run_path.glob("run-*.wandb"))
    assert _rows(tmp_path)[1]["bleu"] == 10.0  # the JSONL logger ran alongside


def test_tensorboard_writes_an_event_file(tmp_path):
    logger = TensorboardLogger(tmp_path)
    logger.log({"loss": 1.5, "ppl": torch.tensor(4.4), "note": "skipped"}, step=5, split="train")
    logger.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_build_loggers_rank_and_validation(tmp_path):
    noop = build_loggers(LoggerConfig(name="tensorboard"), tmp_path / "r1", "x", {}, is_main=False)
    assert isinstance(noop, MultiLogger) and noop.loggers == []
    noop.log({"loss": 1.0}, step=1, split="train")
    noop.close()
    assert not (tmp_path / "r1").exists()
    plain = build_loggers(LoggerConfig(name="none"), tmp_path, "x", {}, is_main=True)
    assert [type(lg) for lg in plain.loggers] == [JsonlLogger]
    plain.close()
    with pytest.raises(ValueError, match="logger.name"):
        build_loggers(LoggerConfig(name="mlflow"), tmp_path, "x", {}, is_main=True)


def test_a_registered_logger_is_selected_by_logger_name_and_a_taken_name_is_refused(tmp_path):
    from hydra import compose, initialize_config_dir

    from tests.conftest import REPO_ROOT
    from transformer.config import ConfigError, register_configs
    from transformer.registry import register_logger
    from transformer.training.monitoring.loggers import LOGGERS, MetricsLogger

    seen = []

    class Collect(MetricsLogger):
        def __init__(self, cfg, run_dir, run_name, config):
            seen.append(("built", cfg.name, run_dir, run_name, config))

        def log(self, metrics, step, split):
            seen.append((split, step, dict(metrics)))

    try:
        register_logger("collect_test", Collect)
        with pytest.raises(ConfigError, match="logger=wandb is a built-in option already"):
            register_logger("wandb", Collect)
        register_configs()
        with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
            node = compose(config_name="train", overrides=["logger=collect_test"]).logger
        assert node.name == "collect_test"
        loggers = build_loggers(node, tmp_path, "run", {"seed": 1}, is_main=True)
        loggers.log({"loss": 2.0}, step=3, split="train")
        loggers.close()
        assert seen == [("built", "collect_test", tmp_path, "run", {"seed": 1}), ("train", 3, {"loss": 2.0})]
        assert _rows(tmp_path)[0]["loss"] == 2.0  # beside metrics.jsonl, not instead of it
        register_logger("returns_none_test", lambda cfg, run_dir, run_name, config: None)
        with pytest.raises(TypeError, match="logger=returns_none_test: its factory returned None, not a MetricsLogger"):
            build_loggers(LoggerConfig(name="returns_none_test"), tmp_path, "run", {}, is_main=True)
    finally:
        LOGGERS.pop("returns_none_test", None)
        LOGGERS.pop("collect_test", None)
