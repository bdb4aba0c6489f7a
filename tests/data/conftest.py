"""Fixtures for the data tests: the real Multi30k folder and a small real corpus loaded once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """``$TRANSFORMER_DATA_DIR`` when set, else ``<repo>/../shared/data``."""
    env = os.environ.get("TRANSFORMER_DATA_DIR")
    return Path(env) if env else (REPO_ROOT / ".." / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data root (holds ``multi30k/``); skips when it is absent."""
    d = shared_data_dir()
    if not (d / "multi30k" / "train.en.gz").is_file():
        pytest.skip(f"real Multi30k data not found under {d}; set TRANSFORMER_DATA_DIR")
    return d


@pytest.fixture(scope="session")
def multi30k_lines(data_dir: Path) -> dict[str, list[str]]:
    """First 3000 raw training lines of English and German."""
    from transformer.data.corpus import read_lines

    return {lang: read_lines(data_dir / "multi30k" / f"train.{lang}.gz")[:3000] for lang in ("en", "de")}


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory, multi30k_lines: dict[str, list[str]]):
    """A joint BPE model (vocab 1000) trained on 3000 real en+de training lines."""
    from transformer.data.tokenizer import Tokenizer

    prefix = tmp_path_factory.mktemp("spm") / "m"
    return Tokenizer.train(multi30k_lines["en"] + multi30k_lines["de"], prefix, vocab_size=1000)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session-wide temporary cache folder."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def en_de_cfg(data_dir: Path, cache_dir: Path):
    """The real multi30k_en_de config (from configs/data) with a small vocabulary and tmp cache."""
    from omegaconf import OmegaConf

    from transformer.config import DataConfig

    cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(REPO_ROOT / "configs" / "data" / "multi30k_en_de.yaml"))
    cfg.root, cfg.cache_dir, cfg.vocab_size = str(data_dir), str(cache_dir), 1000
    return cfg


@pytest.fixture(scope="session")
def en_de_data(en_de_cfg):
    """``load_translation_data`` on the real multi30k_en_de (built once per session)."""
    from transformer.data.dataset import load_translation_data

    return load_translation_data(en_de_cfg, log=None)
