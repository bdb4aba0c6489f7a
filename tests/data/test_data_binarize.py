"""Binarized splits: equal to the text path token for token, atomic, memory-mapped, checked."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO_ROOT
from tests.data.conftest import toy_data_config
from transformer.data import binarize
from transformer.data.binarize import TokenSequences, binarize_split, load_split, read_manifest, token_dtype
from transformer.data.corpus import resolve_split_files
from transformer.data.dataset import load_translation_data
from transformer.data.errors import DataError
from transformer.data.reading import read_parallel


def test_binarized_equals_text_path_token_for_token(en_de_cfg, en_de_data) -> None:
    tok = en_de_data.src_tokenizer
    for name in ("train", "valid", "test_2016_flickr", "test_2017_mscoco"):
        src_lines, tgt_lines, _ = read_parallel(*resolve_split_files(en_de_cfg, name), keep_empty=name != "train")
        ds = en_de_data.splits[name]
        assert ds.src.tolist() == tok.encode_batch(src_lines), name
        assert ds.tgt.tolist() == tok.encode_batch(tgt_lines), name
        assert ds.src_lengths.tolist() == [len(x) for x in tok.encode_batch(src_lines)]
        if name == "train":
            assert ds.src_text is None and ds.tgt_text is None  # raw text only for evaluation splits
        else:
            assert (ds.src_text, ds.tgt_text) == (src_lines, tgt_lines)
    # the training split is memory-mapped, read-only, with the smallest id type
    train = en_de_data.splits["train"].src
    assert isinstance(train, TokenSequences) and train.tokens.dtype == np.uint16
    assert isinstance(train.tokens.base, np.memmap) and not train.tokens.flags.writeable


def test_worker_processes_equal_one_process(en_de_cfg, en_de_data, tmp_path: Path) -> None:
    files = resolve_split_files(en_de_cfg, "train")
    toks = (en_de_data.src_tokenizer, en_de_data.tgt_tokenizer)
    one = binarize_split(*files, toks, tmp_path / "one", keep_text=True, workers=1, chunk_lines=997)
    two = binarize_split(*files, toks, tmp_path / "two", keep_text=True, workers=2, chunk_lines=997)
    assert one["counts"] == two["counts"] and one["counts"]["pairs"] == 29000
    for name in ("src.bin", "tgt.bin", "src.idx.npy", "tgt.idx.npy", "src.txt", "tgt.txt"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_manifest_records_inputs_counts_and_drops(toy_corpus: Path, tmp_path: Path) -> None:
    d = load_translation_data(toy_data_config(toy_corpus, tmp_path / "cache"), log=None)
    manifest = read_manifest(d.stats["split_dirs"]["train"])
    assert manifest["counts"]["lines"] == 1500 and manifest["counts"]["pairs"] == 1498
    assert manifest["dropped"] == {"empty_side": 2}
    assert manifest["counts"]["src_tokens"] == int(d.splits["train"].src_lengths.sum())
    for entry, lang in zip(manifest["inputs"], ("en", "de")):
        path = toy_corpus / f"train.{lang}.gz"
        assert entry["path"] == str(path) and entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["options"]["vocab"]["vocab_size"] == 400 and manifest["files"]["src.bin"]["dtype"] == "<u2"
    top = json.loads((Path(d.stats["cache_dir"]) / "manifest.json").read_text())
    assert top["splits"]["train"] == Path(d.stats["split_dirs"]["train"]).name


class _WideTokenizer:
    """A real tokenizer that claims 70,000 pieces (forces int32 ids)."""

    def __init__(self, tok) -> None:
        self.tok = tok

    def __len__(self) -> int:
        return 70_000

    def encode_batch(self, lines):
        return self.tok.encode_batch(lines)


def test_int32_ids_when_the_vocabulary_does_not_fit_uint16(en_de_cfg, en_de_data, tmp_path: Path) -> None:
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.int32
    wide = _WideTokenizer(en_de_data.src_tokenizer)
    files = resolve_split_files(en_de_cfg, "valid")
    binarize_split(*files, (wide, wide), tmp_path / "wide", keep_text=False, workers=1)
    (src, tgt), texts, manifest = load_split(tmp_path / "wide")
    assert src.tokens.dtype == np.int32 and manifest["files"]["tgt.bin"]["dtype"] == "<i4" and texts is None
    assert tgt.tolist() == en_de_data.splits["valid"].tgt.tolist()


def test_interrupted_binarize_leaves_nothing_that_loads(en_de_cfg, en_de_data, tmp_path: Path, monkeypatch) -> None:
    calls = []
    original = binarize._to_arrays

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(binarize, "_to_arrays", interrupted)
    dest = tmp_path / "split"
    toks = (en_de_data.src_tokenizer, en_de_data.tgt_tokenizer)
    with pytest.raises(KeyboardInterrupt):
        binarize_split(*resolve_split_files(en_de_cfg, "train"), toks, dest, keep_text=False, chunk_lines=1000)
    assert not dest.exists() and list(tmp_path.iterdir()) == []  # no half split, no temporary left
    assert read_manifest(dest) is None
    with pytest.raises(DataError, match="not a complete binarized split"):
        load_split(dest)


_KILLED_BUILD = """
import sys, time
from transformer.data import binarize
from transformer.data.dataset import load_translation_data
from tests.data.conftest import toy_data_config
original, calls = binarize._to_arrays, []
def slow(*args):
    calls.append(1)
    if len(calls) == 6:
        print("ready", flush=True)
        time.sleep(600)
    return original(*args)
binarize._to_arrays = slow
binarize.CHUNK_LINES = 100
load_translation_data(toy_data_config(*map(__import__("pathlib").Path, sys.argv[1:3])), log=None)
"""


def test_sigkill_during_preprocess_leaves_no_dataset_that_loads(toy_corpus: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_KILLED_BUILD), str(toy_corpus), str(cache)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (folder,) = cache.iterdir()
    assert list(folder.glob(".split-*.tmp"))  # the killed build's temporary folder
    assert not [d for d in folder.glob("split-*") if read_manifest(d) is not None]
    with pytest.raises(DataError, match="no readable manifest.json"):
        load_translation_data(toy_data_config(toy_corpus, cache, binarized=str(folder)), log=None)
    # the next run removes the temporary and builds everything
    cfg = toy_data_config(toy_corpus, cache)
    d = load_translation_data(cfg, log=None)
    assert d.stats["split_cache"]["train"] == "miss" and not list(folder.glob(".*.tmp"))
    src, tgt, _ = read_parallel(*resolve_split_files(cfg, "train"))
    assert d.splits["train"].tgt.tolist() == d.tgt_tokenizer.encode_batch(tgt) and len(src) == 1498


def test_damaged_split_is_rebuilt(toy_corpus: Path, tmp_path: Path) -> None:
    cfg = toy_data_config(toy_corpus, tmp_path / "cache")
    first = load_translation_data(cfg, log=None)
    expected = first.splits["train"].src.tolist()
    folder = Path(first.stats["split_dirs"]["train"])
    with open(folder / "src.bin", "r+b") as f:
        f.truncate(100)
    assert read_manifest(folder) is None
    again = load_translation_data(cfg, log=None)
    assert again.stats["split_cache"]["train"] == "miss" and again.splits["train"].src.tolist() == expected


def test_binarized_folder_is_read_without_raw_files(toy_corpus: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    built = load_translation_data(toy_data_config(toy_corpus, cache), log=None)
    folder = built.stats["cache_dir"]
    cfg = toy_data_config(tmp_path / "no_such_root", tmp_path / "other_cache", binarized=folder)
    d = load_translation_data(cfg, log=None)
    assert d.stats["cache"] == "hit" and d.stats["cache_dir"] == folder and not (tmp_path / "other_cache").exists()
    for name in ("train", "valid", "test"):
        assert d.splits[name].src.tolist() == built.splits[name].src.tolist()
    assert d.splits["valid"].tgt_text == built.splits["valid"].tgt_text and d.splits["test"] is d.splits["valid"]
    with pytest.raises(DataError, match=r"data.vocab_size=400 there, 500 here"):
        load_translation_data(toy_data_config(toy_corpus, cache, binarized=folder, vocab_size=500), log=None)
    with pytest.raises(
        DataError, match=r"split\(s\) newstest not in data.binarized=.*available splits: train, valid, test"
    ):
        load_translation_data(cfg, splits=["train", "newstest"], log=None)


def test_token_sequences_write_rows_into_a_padded_array() -> None:
    seqs = TokenSequences.from_lists([[5, 6, 7], [], [8, 9]])
    assert (
        seqs.tokens.dtype == np.int64
        and seqs.offsets.tolist() == [0, 3, 3, 5]
        and seqs.tolist() == [[5, 6, 7], [], [8, 9]]
    )
    out = np.full((3, 5), -1, dtype=np.int64)
    seqs.write_rows(out)
    assert out.tolist() == [[5, 6, 7, -1, -1], [-1] * 5, [8, 9, -1, -1, -1]]
    seqs.write_rows(out, columns=np.array([2, 0, 3]))  # each row from its own column, the rest kept
    assert out.tolist() == [[5, 6, 5, 6, 7], [-1] * 5, [8, 9, -1, 8, 9]]
    # a subset in another order, from a uint16 array: rows read through the offsets, ids widened
    sub = TokenSequences(seqs.tokens.astype(np.uint16), seqs.offsets).subset([2, -3])
    assert sub.lengths.tolist() == [2, 3] and len(sub) == 2
    out = np.zeros((2, 3), dtype=np.int64)
    sub.write_rows(out, columns=np.array([1, 0]))
    assert out.tolist() == [[0, 8, 9], [5, 6, 7]]
    with pytest.raises(ValueError, match="do not fit a width of 3"):
        sub.write_rows(out, columns=1)
    with pytest.raises(ValueError, match=r"expected \(2, width\)"):
        sub.write_rows(np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(IndexError, match="out of range for 3 sequences"):
        seqs.subset([0, 3])
    empty = TokenSequences.from_lists([[], []])
    empty.write_rows(np.zeros((2, 0), dtype=np.int64))  # nothing to write, nothing read
    assert empty.lengths.tolist() == [0, 0]
