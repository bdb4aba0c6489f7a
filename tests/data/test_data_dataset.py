"""load_translation_data on real Multi30k and on small parallel_text corpora: splits, cache, filters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.data.conftest import toy_data_config, write_toy_corpus
from transformer.config import DataConfig
from transformer.data.batching import TokenBatchSampler
from transformer.data.collate import collate
from transformer.data.corpus import DataError, read_lines
from transformer.data.dataset import load_translation_data
from transformer.data.tokenizer import SPECIAL_IDS


def test_real_multi30k_en_de(en_de_data, data_dir: Path) -> None:
    d = en_de_data
    assert list(d.splits) == [
        "train",
        "valid",
        "test",
        "test_2016_flickr",
        "test_2017_flickr",
        "test_2017_mscoco",
        "test_2018_flickr",
    ]
    sizes = {k: len(v) for k, v in d.splits.items()}
    assert sizes == {
        "train": 29000,
        "valid": 1014,
        "test": 1000,
        "test_2016_flickr": 1000,
        "test_2017_flickr": 1000,
        "test_2017_mscoco": 461,
        "test_2018_flickr": 1071,
    }
    assert d.splits["test"] is d.splits["test_2016_flickr"] and d.splits["test"].name == "test_2016_flickr"
    assert d.src_tokenizer is d.tgt_tokenizer and d.joint_vocab and len(d.src_tokenizer) == 1000
    # the raw reference lines are kept, unchanged
    assert d.splits["test"].tgt_text == read_lines(data_dir / "multi30k" / "test_2016_flickr.de.gz")
    valid = d.splits["valid"]
    assert not any(i in SPECIAL_IDS for seq in valid.src[:200] + valid.tgt[:200] for i in seq)
    assert [d.tgt_tokenizer.decode(t) for t in valid.tgt[:200]] == [" ".join(s.split()) for s in valid.tgt_text[:200]]
    assert d.stats["filtered_by_length"] == {"train": 0} and d.stats["dropped_empty"]["train"] == 0


def test_second_call_is_a_cache_hit(en_de_cfg, en_de_data) -> None:
    t = time.perf_counter()
    again = load_translation_data(en_de_cfg, splits=["train", "valid"], log=None)
    elapsed = time.perf_counter() - t
    assert again.stats["cache"] == "hit" and again.stats["cache_dir"] == en_de_data.stats["cache_dir"]
    assert elapsed < 5.0
    assert again.splits["train"].src.tolist() == en_de_data.splits["train"].src.tolist()
    assert again.src_tokenizer.model_path == en_de_data.src_tokenizer.model_path


def test_length_filter_train_only(en_de_cfg, en_de_data) -> None:
    cfg = en_de_cfg.copy()
    cfg.max_source_positions, cfg.max_target_positions = 12, 14
    d = load_translation_data(cfg, splits=["train", "valid"], log=None)
    assert d.stats["cache"] == "hit"  # filtering does not change the cache key
    train, full = d.splits["train"], en_de_data.splits["train"]
    removed = d.stats["filtered_by_length"]["train"]
    assert removed > 0 and len(train) == len(full) - removed
    assert all(len(s) + 1 <= 12 and len(t) + 1 <= 14 for s, t in zip(train.src, train.tgt))
    assert len(d.splits["valid"]) == 1014 and d.stats["over_length"]["valid"] > 0  # kept whole


def test_train_max_target_tokens_keeps_short_targets_in_training_only(en_de_cfg, en_de_data) -> None:
    """The length study's filter: targets of at most L subword tokens in training, validation whole;
    L=0 is refused by validation."""
    cfg = en_de_cfg.copy()
    cfg.train_max_target_tokens = 15
    lines = []
    d = load_translation_data(cfg, splits=["train", "valid"], log=lines.append)
    train, full = d.splits["train"], en_de_data.splits["train"]
    assert d.stats["cache"] == "hit" and max(len(t) for t in train.tgt) == 15
    assert len(train) == int((full.tgt_lengths <= 15).sum()) == len(full) - d.stats["filtered_by_length"]["train"]
    assert d.stats["filtered_by_train_max_target_tokens"] == len(full) - len(train)
    assert len(d.splits["valid"]) == 1014 and max(len(t) for t in d.splits["valid"].tgt) > 15
    assert "with targets over data.train_max_target_tokens=15" in lines[-1]
    cfg.train_max_target_tokens = 0
    from transformer.config import ConfigError, to_config, validate_config

    with pytest.raises(ConfigError, match="data.train_max_target_tokens=0 must be >= 1"):
        validate_config(to_config({"data": {"train_max_target_tokens": 0}}))


def test_missing_split_through_loader(en_de_cfg) -> None:
    with pytest.raises(DataError, match="available splits: train, valid, test, test_2016_flickr"):
        load_translation_data(en_de_cfg, splits=["test_2019"], log=None)


def test_real_batches_both_archs(en_de_data) -> None:
    train = en_de_data.splits["train"]
    for arch in ("encoder_decoder", "decoder_only"):
        s = TokenBatchSampler(train.src_lengths, train.tgt_lengths, 2048, arch=arch, seed=3)
        indices = next(iter(s))
        b = collate(train, indices, arch)
        width = b.net_input["src_tokens"].shape[1] if arch == "encoder_decoder" else b.target.shape[1]
        assert b.nsentences * max(width, b.target.shape[1]) <= 2048


def _toy_corpus(root: Path, data_dir: Path, n_train: int = 1500) -> None:
    write_toy_corpus(root, data_dir, n_train)


def _toy_cfg(root: Path, cache: Path, **kw) -> DataConfig:
    return toy_data_config(root, cache, **kw)


def test_parallel_text_cache_and_rebuild_on_change(tmp_path: Path, data_dir: Path) -> None:
    root, cache = tmp_path / "corpus", tmp_path / "cache"
    root.mkdir()
    _toy_corpus(root, data_dir)
    cfg = _toy_cfg(root, cache)
    first = load_translation_data(cfg, log=None)
    assert first.stats["cache"] == "miss" and first.stats["dropped_empty"]["train"] == 2
    assert len(first.splits["train"]) == 1498 and list(first.splits) == ["train", "valid", "test"]
    assert first.splits["test"] is first.splits["valid"]
    assert load_translation_data(cfg, log=None).stats["cache"] == "hit"
    # a changed validation file: vocabulary reused, that split rebuilt
    (root / "dev.de").write_text("Ein Hund.\n" * 100, encoding="utf-8")
    second = load_translation_data(cfg, log=None)
    assert second.stats["tokenizer_cache"] == "hit" and second.stats["split_cache"]["valid"] == "miss"
    assert second.splits["valid"].tgt_text[0] == "Ein Hund."
    # a changed training file: a new vocabulary in a new folder
    _toy_corpus(root, data_dir, n_train=1400)
    third = load_translation_data(cfg, log=None)
    assert third.stats["tokenizer_cache"] == "miss" and third.stats["cache_dir"] != first.stats["cache_dir"]
    # an option that changes the vocabulary rebuilds too
    assert load_translation_data(_toy_cfg(root, cache, vocab_size=300), log=None).stats["tokenizer_cache"] == "miss"


def test_separate_vocabularies(tmp_path: Path, data_dir: Path) -> None:
    root = tmp_path / "corpus"
    root.mkdir()
    _toy_corpus(root, data_dir)
    d = load_translation_data(_toy_cfg(root, tmp_path / "cache", joint_vocab=False, vocab_size=300), log=None)
    assert d.src_tokenizer is not d.tgt_tokenizer and not d.joint_vocab
    assert d.src_tokenizer.model_path.name == "spm.src.model"
    valid = d.splits["valid"]
    assert d.tgt_tokenizer.decode(valid.tgt[0]) == " ".join(valid.tgt_text[0].split())


def test_mismatched_corpus_fails_loudly(tmp_path: Path) -> None:
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("a\n")
    cfg = _toy_cfg(tmp_path, tmp_path / "cache", test_prefix=None)
    with pytest.raises(DataError, match=r"train\.en has 2 lines.*train\.de has 1 lines"):
        load_translation_data(cfg, splits=["train"], log=None)


def test_yaml_configs_validate_against_dataclass(data_dir: Path) -> None:
    from transformer.data.corpus import available_splits

    folder = Path(__file__).resolve().parents[2] / "configs" / "data"
    names = sorted(p.stem for p in folder.glob("*.yaml"))
    assert names == sorted(
        [
            "multi30k_en_de",
            "multi30k_de_en",
            "multi30k_en_fr",
            "multi30k_en_cs",
            "multi30k_tok_en_de",
            "multi30k_tok_en_fr",
            "parallel_text",
            "wmt14_en_de",
        ]
    )
    for name in names:
        cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(folder / f"{name}.yaml"))
        assert cfg.name == name
        if name == "parallel_text":
            assert cfg.test_prefix is None and cfg.test_splits == []
            with pytest.raises(DataError, match="data.src_lang, data.tgt_lang, data.train_prefix, data.valid_prefix"):
                available_splits(cfg)
            continue
        if name == "wmt14_en_de":  # not on disk here: tests/scripts/test_preprocess.py generates its shape
            assert cfg.corpus == "parallel_text" and cfg.test_splits == [cfg.test_prefix] and cfg.vocab_size == 37000
            continue
        cfg.root = str(data_dir)
        assert set(cfg.test_splits) <= set(available_splits(cfg)), name
        assert cfg.test_prefix in cfg.test_splits
        assert (cfg.bleu_tokenize == "none") == (cfg.corpus == "multi30k_tok")


def test_empty_training_files_are_named(tmp_path: Path) -> None:
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("")
        (tmp_path / f"dev.{lang}").write_text("a\n")
    cfg = _toy_cfg(tmp_path, tmp_path / "cache")
    with pytest.raises(
        DataError,
        match=rf"no non-empty sentence pairs in the training files {tmp_path}/train\.en "
        rf"and {tmp_path}/train\.de \(the files are empty\)",
    ):
        load_translation_data(cfg, log=None)
    (tmp_path / "train.en").write_text("a\n\nc\n")
    (tmp_path / "train.de").write_text("\nb\n \n")
    with pytest.raises(DataError, match=r"train\.de \(all 3 lines have an empty side\)"):
        load_translation_data(cfg, log=None)


def test_empty_validation_split_is_rejected_before_training(toy_corpus: Path, tmp_path: Path) -> None:
    for lang in ("en", "de"):
        (toy_corpus / f"dev.{lang}").write_text("")
    with pytest.raises(
        DataError,
        match=rf"the validation split is empty: {toy_corpus}/dev\.en and "
        rf"{toy_corpus}/dev\.de hold no sentence pair \(0 lines read\)",
    ):
        load_translation_data(_toy_cfg(toy_corpus, tmp_path / "cache"), log=None)


def test_gz_file_that_is_not_gzip_is_named(toy_corpus: Path, tmp_path: Path) -> None:
    (toy_corpus / "train.de.gz").write_text("Ein Hund.\n" * 1500)  # plain text under a .gz name
    with pytest.raises(DataError, match=r"train\.de\.gz: the name ends in \.gz but the file is not gzip-compressed"):
        load_translation_data(_toy_cfg(toy_corpus, tmp_path / "cache"), log=None)


@pytest.mark.parametrize("split", ["train", "dev"])
def test_invalid_utf8_is_named_with_file_and_line(toy_corpus: Path, tmp_path: Path, split: str) -> None:
    import gzip

    name = f"{split}.de.gz" if split == "train" else f"{split}.de"
    path = toy_corpus / name
    lines = read_lines(path)
    data = "\n".join(lines).encode().split(b"\n")
    data[41] = b"kaputt \xff\xfe"
    raw = b"\n".join(data) + b"\n"
    path.write_bytes(gzip.compress(raw) if split == "train" else raw)
    with pytest.raises(DataError, match=rf"{name}: invalid UTF-8 on line 42 \(byte 8 of the line"):
        load_translation_data(_toy_cfg(toy_corpus, tmp_path / "cache"), log=None)
