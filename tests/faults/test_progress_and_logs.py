"""What a person sees on long work. Decoding inside training (validation BLEU,
the final test) shows progress, off with ``train.progress=false``; the progress bar shows current
values when ``train.max_updates < train.log_every`` (and metrics.jsonl records the last update);
``train.log`` in the run folder holds the run's log."""

from __future__ import annotations

import json
import re

import pytest
from omegaconf import OmegaConf

from tests.faults.conftest import small_config
from transformer.training.job.run import train


def _train_metrics(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == "train"]


def test_bar_and_metrics_show_the_last_update_below_log_every(gappy_corpus, tmp_path, capfd):
    run = tmp_path / "run"
    train(
        small_config(
            gappy_corpus,
            run,
            "train.max_updates=3",
            "train.log_every=50",
            "train.progress=true",
            "train.validate_every=0",
        )
    )
    err = capfd.readouterr().err
    rows = _train_metrics(run)
    assert [r["update"] for r in rows] == [1, 3]
    shown = re.findall(r"loss=([0-9.]+)", err)
    assert shown and float(shown[-1]) == pytest.approx(rows[-1]["loss"], abs=1e-3)


def test_decoding_in_training_shows_progress_and_the_switch_turns_it_off(gappy_corpus, tmp_path, capfd):
    train(
        small_config(
            gappy_corpus, tmp_path / "on", "train.max_updates=2", "train.validate_every=2", "train.progress=true"
        )
    )
    err = capfd.readouterr().err
    assert re.search(r"valid[^\n\r]*\d+/\d+ \[", err), err[-2000:]
    assert re.search(r"test_2016_flickr[^\n\r]*30/30 \[", err), err[-2000:]
    train(
        small_config(
            gappy_corpus, tmp_path / "off", "train.max_updates=2", "train.validate_every=2", "train.progress=false"
        )
    )
    err = capfd.readouterr().err
    assert "/30 [" not in err and "it/s" not in err and "sent/s" not in err


def test_train_log_holds_the_runs_log(gappy_corpus, tmp_path):
    run = tmp_path / "run"
    train(small_config(gappy_corpus, run, "train.max_updates=2", "train.validate_every=2", "train.pad_to_multiple=8"))
    text = (run / "train.log").read_text(encoding="utf-8")
    assert "[data]" in text and "[valid] update 2" in text and "stopped:" in text and "[test]" in text
    assert re.search(
        r"model: encoder_decoder, [\d,]+ parameters, precision \w+ \(train.precision=\w+\), eager \(train.compile=false\); run folder",
        text,
    ), text[:2000]
    shapes = re.search(
        r"batches: (\d+) distinct \(rows x length\) shapes per epoch, (\d+) batches \(train.pad_to_multiple=8", text
    )
    assert shapes and 1 <= int(shapes.group(1)) <= int(shapes.group(2)), text[:2000]


def test_pad_to_multiple_auto_resolves_by_device_and_the_run_records_the_number(gappy_corpus, tmp_path):
    run = tmp_path / "run"
    train(
        small_config(
            gappy_corpus,
            run,
            "train.max_updates=1",
            "train.validate_every=1",
            "train.valid_bleu=false",
            "train.precision=fp32",
            "train.pad_to_multiple=auto",
        )
    )
    text = (run / "train.log").read_text(encoding="utf-8")
    assert "(train.pad_to_multiple=auto: 1, " in text, text[:2000]  # fp32 on a CPU: no rounding (measured)
    assert OmegaConf.load(run / "config.yaml").train.pad_to_multiple == 1
