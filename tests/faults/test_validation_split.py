"""A validation split the model cannot score is refused before
any update, with a sentence naming the fields, instead of a ``ZeroDivisionError`` at the first
validation after all the training. (Files without any pair are refused by the data loader:
tests/data/test_data_dataset.py::test_empty_validation_split_is_rejected_before_training.)"""

from __future__ import annotations

import shutil

import pytest

from tests.faults.conftest import small_config
from transformer.training.job.run import train
from transformer.training.loop.trainer import TrainingError

MAX_POSITIONS = 24


def test_no_validation_pair_within_learned_positions_fails_before_training(gappy_corpus, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in gappy_corpus.glob("*.*"):
        if f.is_file():
            shutil.copyfile(f, corpus / f.name)
    for lang in ("en", "de"):  # every validation sentence four times over: longer than 24 positions
        lines = (corpus / f"val.{lang}").read_text(encoding="utf-8").splitlines()
        (corpus / f"val.{lang}").write_text("".join(" ".join([s or "x"] * 4) + "\n" for s in lines), encoding="utf-8")
    run = tmp_path / "run"
    cfg = small_config(
        corpus,
        run,
        "model/position=learned",
        f"model.max_positions={MAX_POSITIONS}",
        f"data.max_source_positions={MAX_POSITIONS - 1}",
        f"data.max_target_positions={MAX_POSITIONS - 1}",
        "train.validate_every=2",
    )
    with pytest.raises(
        TrainingError,
        match=rf"none of the \d+ validation pairs fits model\.max_positions="
        rf"{MAX_POSITIONS} .*data\.valid_prefix",
    ):
        train(cfg)
    assert not list(run.glob("checkpoint_*"))  # refused before the first update
