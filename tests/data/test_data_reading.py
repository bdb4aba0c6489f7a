"""The streaming reader: blocks, errors naming file and line, gzip by magic bytes."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.data.test_data_corpus import write
from transformer.data.errors import DataError
from transformer.data.reading import count_lines, iter_line_blocks, iter_parallel, read_lines


@pytest.mark.parametrize("gz", [False, True])
def test_small_blocks_give_the_same_lines(tmp_path: Path, gz: bool) -> None:
    text = "\ufeff" + "Zwei Männer ✓\r\n\n  lead and trail  \nx" * 50 + "\r\nlast"
    p = write(tmp_path / ("a.de.gz" if gz else "a.de"), text, gz)
    whole = read_lines(p)
    assert whole[:4] == ["Zwei Männer ✓", "", "  lead and trail  ", "xZwei Männer ✓"] and whole[-1] == "last"
    for block in (1, 7, 64):
        blocks = list(iter_line_blocks(p, block_bytes=block))
        assert [line for b in blocks for line in b] == whole
    assert count_lines(p) == len(whole) == 152


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_deep_in_a_large_file_names_file_and_line(tmp_path: Path, gz: bool) -> None:
    lines = [f"line {i} ok" for i in range(50_000)]
    data = ("\n".join(lines) + "\n").encode() + b"bad \xc3\x28 here\nafter\n"
    p = write(tmp_path / ("big.en.gz" if gz else "big.en"), data, gz)
    with pytest.raises(DataError, match=rf"{p.name}: invalid UTF-8 on line 50001 \(byte 5 of the line"):
        for _ in iter_line_blocks(p, block_bytes=4096):
            pass


def test_gz_name_without_gzip_content_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path / "train.en.gz", "plain text\nnot compressed\n")
    with pytest.raises(DataError, match=r"train\.en\.gz: the name ends in \.gz but the file is not gzip-compressed"):
        read_lines(p)
    # gzip content under a plain name is still recognised by its magic bytes
    assert read_lines(write(tmp_path / "train.de", "a\nb\n", gz=True)) == ["a", "b"]


def test_truncated_gzip_names_file(tmp_path: Path) -> None:
    data = gzip.compress(("\n".join(f"sentence {i}" for i in range(20_000)) + "\n").encode())
    p = write(tmp_path / "cut.en.gz", data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cut\.en\.gz: damaged gzip file after line \d+"):
        count_lines(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        read_lines(tmp_path / "nope.en")


@pytest.mark.parametrize("longer", ["src", "tgt"])
def test_parallel_stream_mismatch_names_both_files_and_full_counts(tmp_path: Path, longer: str) -> None:
    n = 1234
    s = write(tmp_path / "x.en", "".join(f"s{i}\n" for i in range(n + (longer == "src") * 7)))
    t = write(tmp_path / "x.de", "".join(f"t{i}\n" for i in range(n + (longer == "tgt") * 7)), gz=True)
    n_src, n_tgt = (n + 7, n) if longer == "src" else (n, n + 7)
    with pytest.raises(DataError, match=rf"x\.en has {n_src} lines, .*x\.de has {n_tgt} lines"):
        for _ in iter_parallel(s, t, chunk_lines=100):
            pass


def test_parallel_stream_chunks_drop_and_keep(tmp_path: Path) -> None:
    s = write(tmp_path / "x.en", "one\n\nthree\nfour\n   \nsix\nseven\n")
    t = write(tmp_path / "x.de", "eins\nzwei\n\nvier\nfünf\nsechs\nsieben\n")
    chunks = list(iter_parallel(s, t, chunk_lines=3))
    assert [(c.first_line, c.n_read, c.n_dropped) for c in chunks] == [(1, 3, 2), (4, 3, 1), (7, 1, 0)]
    assert [x for c in chunks for x in c.src] == ["one", "four", "six", "seven"]
    assert [x for c in chunks for x in c.tgt] == ["eins", "vier", "sechs", "sieben"]
    kept = list(iter_parallel(s, t, chunk_lines=100, drop_empty=False))
    assert kept[0].src == read_lines(s) and kept[0].tgt == read_lines(t) and kept[0].n_dropped == 0
    assert list(iter_parallel(write(tmp_path / "e.en", ""), write(tmp_path / "e.de", ""))) == []
