"""Verified Multi30k download, against a local HTTP server on 127.0.0.1 (no internet needed)."""

from __future__ import annotations

import functools
import gzip
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from transformer.config import DataConfig
from transformer.data import download as dl
from transformer.data.corpus import DataError, read_lines, resolve_split_files

SPLIT = "test_2017_mscoco"  # the smallest split


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def server(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Serve an upstream-shaped copy (raw/*.gz, tok/* plain) of two Multi30k splits.

    Yields ``(base_url, served_folder)``.
    """
    served = tmp_path_factory.mktemp("upstream")
    (served / "raw").mkdir()
    (served / "tok").mkdir()
    for split in (SPLIT, "val"):
        for lang in ("en", "de"):
            shutil.copy(data_dir / "multi30k" / f"{split}.{lang}.gz", served / "raw")
            plain = gzip.decompress((data_dir / "multi30k" / "tok" / f"{split}.lc.norm.tok.{lang}.gz").read_bytes())
            (served / "tok" / f"{split}.lc.norm.tok.{lang}").write_bytes(plain)
    # a corrupted copy: val.de.gz with one byte changed, tokenized val.de with a changed word
    bad = bytearray((served / "raw" / "val.de.gz").read_bytes())
    bad[len(bad) // 2] ^= 0xFF
    (served / "raw" / "val.de.gz").write_bytes(bytes(bad))
    tok_de = served / "tok" / "val.lc.norm.tok.de"
    tok_de.write_bytes(tok_de.read_bytes().replace(b" eine ", b" einE ", 1))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    finally:
        httpd.shutdown()
        httpd.server_close()


def _closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more


def test_checksums_match_shared_sha256sums(data_dir: Path) -> None:
    for sums, prefix in (
        (data_dir / "multi30k" / "SHA256SUMS", ""),
        (data_dir / "multi30k" / "tok" / "SHA256SUMS", "tok/"),
    ):
        for line in sums.read_text().splitlines():
            digest, name = line.split()
            assert dl.MULTI30K_SHA256[prefix + name] == digest
    assert len(dl.MULTI30K_SHA256) == 22 + 18
    assert all(ok for ok in dl.verify_multi30k(data_dir).values())


def test_download_raw_and_tok_verified(server: tuple[str, Path], data_dir: Path, tmp_path: Path) -> None:
    base, _ = server
    rels = [dl.multi30k_relpath(SPLIT, "en"), dl.multi30k_relpath(SPLIT, "de", tokenized=True)]
    paths = dl.ensure_multi30k(tmp_path, rels, base_url=base, log=None)
    assert paths[0].read_bytes() == (data_dir / "multi30k" / rels[0]).read_bytes()  # same bytes upstream
    assert read_lines(paths[1]) == read_lines(data_dir / "multi30k" / rels[1])  # our gzip, same text
    assert dl.verify_multi30k(tmp_path) == {rels[0]: True, rels[1]: True}
    assert sorted(p.name for p in (tmp_path / "multi30k").rglob("*") if p.is_file()) == sorted(p.name for p in paths)


@pytest.mark.parametrize("tokenized", [False, True])
def test_corrupted_download_rejected_and_not_left_behind(
    server: tuple[str, Path], tmp_path: Path, tokenized: bool
) -> None:
    base, _ = server
    rel = dl.multi30k_relpath("val", "de", tokenized)
    with pytest.raises(DataError, match="checksum mismatch"):
        dl.download_multi30k_file(tmp_path, rel, base_url=base, log=None)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_resolve_split_downloads_through_module_base_url(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dl, "MULTI30K_BASE_URL", server[0])
    cfg = DataConfig(corpus="multi30k", root=str(tmp_path), src_lang="de", tgt_lang="en")
    src, tgt = resolve_split_files(cfg, SPLIT)
    assert (src, tgt) == (tmp_path / "multi30k" / f"{SPLIT}.de.gz", tmp_path / "multi30k" / f"{SPLIT}.en.gz")
    assert len(read_lines(src)) == len(read_lines(tgt)) == 461


def test_offline_error_names_missing_files_and_variable(tmp_path: Path) -> None:
    rels = [dl.multi30k_relpath("train", "en"), dl.multi30k_relpath("train", "de")]
    with pytest.raises(DataError) as e:
        dl.ensure_multi30k(tmp_path, rels, base_url=_closed_port_url(), log=None)
    msg = str(e.value)
    assert "train.en.gz" in msg and "train.de.gz" in msg and "TRANSFORMER_DATA_DIR" in msg
    assert not (tmp_path / "multi30k").exists() or not any((tmp_path / "multi30k").iterdir())


def test_download_disabled_error(tmp_path: Path) -> None:
    cfg = DataConfig(corpus="multi30k", root=str(tmp_path), download=False)
    with pytest.raises(DataError, match=r"train\.en\.gz, train\.de\.gz.*TRANSFORMER_DATA_DIR"):
        resolve_split_files(cfg, "train")


def test_an_excerpt_is_the_first_pairs_of_each_split_and_a_short_or_missing_file_is_named(tmp_path):
    root = tmp_path / "data"
    (root / "multi30k").mkdir(parents=True)
    for lang in ("en", "de"):
        with gzip.open(root / "multi30k" / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(f"{lang} line {i}\n" for i in range(5)))
    folder = dl.multi30k_excerpt(root, tmp_path / "excerpt", {"train": 3})
    assert (folder / "train.de").read_text(encoding="utf-8") == "de line 0\nde line 1\nde line 2\n"
    assert f"data.root={folder}" in dl.excerpt_overrides(folder, 300)
    with pytest.raises(DataError, match=r"train\.en\.gz: 5 lines, 6 asked for"):
        dl.multi30k_excerpt(root, tmp_path / "more", {"train": 6})
    with pytest.raises(DataError, match=r"val\.en\.gz: no such Multi30k file"):
        dl.multi30k_excerpt(root, tmp_path / "val", {"val": 1})
