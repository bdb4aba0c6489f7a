"""Reading files, bad input and split resolution."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from transformer.config import DataConfig
from transformer.data.corpus import (
    DataError,
    available_splits,
    data_root,
    read_lines,
    read_parallel,
    resolve_split_files,
)


def write(path: Path, text: str | bytes, gz: bool = False) -> Path:
    data = text.encode("utf-8") if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_read_lines_keeps_whitespace_strips_newline_only(tmp_path: Path, gz: bool) -> None:
    p = write(tmp_path / "a.en", "\ufeff a  b \r\nc\t\n\nlast", gz)
    assert read_lines(p) == [" a  b ", "c\t", "", "last"]


def test_read_lines_real_multi30k(data_dir: Path) -> None:
    lines = read_lines(data_dir / "multi30k" / "val.de.gz")
    assert len(lines) == 1014
    assert lines[0] == "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    p = write(tmp_path / "bad.de.gz", b"gut\nauch gut\nschlecht \xff\xfe hier\n", gz=True)
    with pytest.raises(DataError, match=r"bad\.de\.gz.*line 3"):
        read_lines(p)


def test_mismatched_line_counts_names_both_files_and_counts(tmp_path: Path) -> None:
    s = write(tmp_path / "x.en", "a\nb\nc\n")
    t = write(tmp_path / "x.de", "a\nb\n")
    with pytest.raises(DataError) as e:
        read_parallel(s, t)
    msg = str(e.value)
    assert str(s) in msg and str(t) in msg and "3 lines" in msg and "2 lines" in msg


def test_empty_lines_drop_the_pair_and_are_counted(tmp_path: Path) -> None:
    s = write(tmp_path / "x.en", "one\n\nthree\nfour\n   \n")
    t = write(tmp_path / "x.de", "eins\nzwei\n\nvier\nfünf\n")
    src, tgt, dropped = read_parallel(s, t)
    assert (src, tgt, dropped) == (["one", "four"], ["eins", "vier"], 3)


def parallel_cfg(root: Path, **kw) -> DataConfig:
    base = dict(
        name="toy",
        corpus="parallel_text",
        root=str(root),
        src_lang="en",
        tgt_lang="de",
        train_prefix="train",
        valid_prefix="dev",
        test_prefix=None,
        test_splits=[],
        download=False,
    )
    base.update(kw)
    return DataConfig(**base)


def test_parallel_text_resolves_plain_and_gz_relative_and_absolute(tmp_path: Path) -> None:
    write(tmp_path / "train.en", "a\n")
    write(tmp_path / "train.de.gz", "b\n", gz=True)
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "dev.en", "c\n")
    write(tmp_path / "sub" / "dev.de", "d\n")
    cfg = parallel_cfg(tmp_path, valid_prefix=str(tmp_path / "sub" / "dev"))
    assert resolve_split_files(cfg, "train") == (tmp_path / "train.en", tmp_path / "train.de.gz")
    assert resolve_split_files(cfg, "valid")[0] == tmp_path / "sub" / "dev.en"
    assert available_splits(cfg) == ["train", "valid"]


def test_missing_split_lists_available_splits(tmp_path: Path) -> None:
    write(tmp_path / "train.en", "a\n")
    write(tmp_path / "train.de", "b\n")
    cfg = parallel_cfg(tmp_path)
    with pytest.raises(DataError, match=r"'valid'.*available splits: train$"):
        resolve_split_files(cfg, "valid")
    with pytest.raises(DataError, match=r"'nope'.*available splits: train"):
        resolve_split_files(cfg, "nope")


def test_multi30k_unavailable_split_lists_available(data_dir: Path) -> None:
    cfg = DataConfig(
        corpus="multi30k",
        root=str(data_dir),
        src_lang="en",
        tgt_lang="cs",
        test_splits=["test_2016_flickr", "test_2018_flickr"],
    )
    names = available_splits(cfg)
    assert names == ["train", "valid", "test", "test_2016_flickr", "test_2018_flickr"]
    with pytest.raises(
        DataError, match=r"test_2017_mscoco.*available splits: train, valid, test, test_2016_flickr, test_2018_flickr"
    ):
        resolve_split_files(cfg, "test_2017_mscoco")
    src, tgt = resolve_split_files(cfg, "test_2018_flickr")
    assert (src.name, tgt.name) == ("test_2018_flickr.en.gz", "test_2018_flickr.cs.gz")


def test_multi30k_tok_files(data_dir: Path) -> None:
    cfg = DataConfig(corpus="multi30k_tok", root=str(data_dir), src_lang="en", tgt_lang="fr")
    src, tgt = resolve_split_files(cfg, "valid")
    assert src == data_dir / "multi30k" / "tok" / "val.lc.norm.tok.en.gz"
    assert read_lines(src)[0] == read_lines(src)[0].lower()


def test_data_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root(DataConfig(root=str(tmp_path / "r"))) == tmp_path / "r"
    assert data_root(DataConfig()) == tmp_path / "env"
    monkeypatch.delenv("TRANSFORMER_DATA_DIR")
    assert data_root(DataConfig()) == tmp_path / "xdg" / "transformer_zoo" / "data"
