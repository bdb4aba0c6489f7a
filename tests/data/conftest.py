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

    cfg = OmegaConf.merge(
        OmegaConf.structured(DataConfig), OmegaConf.load(REPO_ROOT / "configs" / "data" / "multi30k_en_de.yaml")
    )
    cfg.root, cfg.cache_dir, cfg.vocab_size = str(data_dir), str(cache_dir), 1000
    return cfg


@pytest.fixture(scope="session")
def en_de_data(en_de_cfg):
    """``load_translation_data`` on the real multi30k_en_de (built once per session)."""
    from transformer.data.dataset import load_translation_data

    return load_translation_data(en_de_cfg, log=None)


def write_toy_corpus(root: Path, data_dir: Path, n_train: int = 1500) -> Path:
    """A parallel_text corpus in ``root`` built from real Multi30k lines: ``train.{en,de}.gz``
    (``n_train`` pairs, two of them with an empty side) and ``dev.{en,de}`` (100 pairs)."""
    import gzip

    from transformer.data.reading import read_lines

    root.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = read_lines(data_dir / "multi30k" / f"train.{lang}.gz")[:n_train]
        lines[5] = "" if lang == "en" else lines[5]
        lines[9] = "   " if lang == "de" else lines[9]
        (root / f"train.{lang}.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
        val = read_lines(data_dir / "multi30k" / f"val.{lang}.gz")[:100]
        (root / f"dev.{lang}").write_text("\n".join(val) + "\n", encoding="utf-8")
    return root


def toy_data_config(root: Path, cache: Path, **kw):
    """A parallel_text DataConfig over :func:`write_toy_corpus` (vocabulary 400)."""
    from transformer.config import DataConfig

    base = dict(
        name="toy",
        corpus="parallel_text",
        root=str(root),
        src_lang="en",
        tgt_lang="de",
        train_prefix="train",
        valid_prefix="dev",
        test_prefix="dev",
        test_splits=[],
        download=False,
        vocab_size=400,
        cache_dir=str(cache),
        preprocess_workers=1,
    )
    base.update(kw)
    return DataConfig(**base)


@pytest.fixture
def toy_corpus(tmp_path: Path, data_dir: Path) -> Path:
    """:func:`write_toy_corpus` in a fresh temporary folder."""
    return write_toy_corpus(tmp_path / "corpus", data_dir)


@pytest.fixture
def toy_cfg():
    """The :func:`toy_data_config` factory."""
    return toy_data_config
