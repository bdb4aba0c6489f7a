"""Fixtures for trainer tests: a small slice of real Multi30k as a parallel_text corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import REPO_ROOT, multi30k_excerpt, parallel_text_args
from transformer.config import register_configs

SIZES = {"train": 600, "val": 40, "test_2016_flickr": 30}


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """The first lines of Multi30k en-de train/val/test in plain files ``{split}.{lang}``."""
    return multi30k_excerpt(tmp_path_factory.mktemp("corpus"), SIZES)


def small_cli_args(corpus: Path, run_dir: Path, *overrides: str) -> list[str]:
    """Overrides of a tiny, fast training run on ``corpus`` writing into ``run_dir``."""
    return [
        *parallel_text_args(corpus, 300),
        "model.n_encoder_layers=2",
        "model.n_decoder_layers=2",
        "model.d_model=32",
        "model.n_heads=4",
        "model.d_ff=64",
        "model.dropout=0.1",
        "train.max_tokens=600",
        "train.max_updates=6",
        "train.max_time=0",
        "train.validate_every=3",
        "train.valid_bleu_subset=8",
        "train.log_every=1",
        "train.progress=false",
        "train.num_threads=1",
        "train.precision=fp32",
        "lr_scheduler.warmup_updates=4",
        "generation.beam_size=2",
        "generation.max_len_a=1.0",
        "generation.max_len_b=5",
        f"run_dir={run_dir}",
        *overrides,
    ]


def small_config(corpus: Path, run_dir: Path, *overrides: str):
    """:func:`small_cli_args` composed in-process into a config."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=small_cli_args(corpus, run_dir, *overrides))
