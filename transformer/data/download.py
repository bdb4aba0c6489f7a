"""Multi30k files (Elliott et al. 2016; WMT 2016-2018 multimodal task 1): where they come from,
their checksums, and a verified download from the ``multi30k/dataset`` repository.

Raw files are stored as upstream's ``raw/{split}.{lang}.gz`` and checked byte for byte
(:data:`MULTI30K_SHA256`); tokenized files (``tok/{split}.lc.norm.tok.{lang}``, plain upstream) are
stored gzip-compressed and checked by their decompressed content
(:data:`MULTI30K_TOK_CONTENT_SHA256`), since gzip bytes depend on the compressor. A download is
verified before it is renamed into place. Tests point :data:`MULTI30K_BASE_URL` at a local server."""

from __future__ import annotations

import gzip
import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from transformer.data.errors import DataError
from transformer.runs.io import atomic_write_bytes

ENV_DATA_DIR = "TRANSFORMER_DATA_DIR"
"""Environment variable naming the data root (a folder that holds ``multi30k/``)."""

MULTI30K_BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1"
"""Upstream folder; ``{base}/raw/{split}.{lang}.gz`` and ``{base}/tok/{split}.lc.norm.tok.{lang}``."""

MULTI30K_SHA256: dict[str, str] = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.cs.gz": "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "tok/test_2016_flickr.lc.norm.tok.de.gz": "2628844bbb7783afa0ba8a9927f174aafeee715871aa8deed3af2c4d0b71a658",
    "tok/test_2016_flickr.lc.norm.tok.en.gz": "b95df925929cb222d0cf733f153bcbfba0f00180c85fd61dd5c4fb27f29ee394",
    "tok/test_2016_flickr.lc.norm.tok.fr.gz": "97b9b377d15dfc98e55e270dda3d6c91f8df02a5cf9e682457f6c59bd6be00db",
    "tok/test_2017_flickr.lc.norm.tok.de.gz": "aa48934689a0fac1f506d19878ef9f48d823b2f1655bd3db5018f533cc0b2111",
    "tok/test_2017_flickr.lc.norm.tok.en.gz": "6f015edf8eea8e5bff43d65e1743b2572577756b671a203651ccce508e787c35",
    "tok/test_2017_flickr.lc.norm.tok.fr.gz": "d9905df4ff42d30afbf2affdfe4ebfc3700d3b468f56746e69c3a0f8a1d0ddc1",
    "tok/test_2017_mscoco.lc.norm.tok.de.gz": "41d547d42224fd190b5ea169a18a840e9625bb7844d4255008e2400597275580",
    "tok/test_2017_mscoco.lc.norm.tok.en.gz": "547d290e8b81097e8a307b1ef5b6ce7ff29fed52ae63a779a45bd4cc739f67c2",
    "tok/test_2017_mscoco.lc.norm.tok.fr.gz": "32a29bc523f0d5446e792de90dec9f7874fdc14a917a783f8e9a1ab06f52abfd",
    "tok/test_2018_flickr.lc.norm.tok.de.gz": "87b950eb1b484c97882d29e1ffceec68568d6a4b2bf72b1e7f9cdd62e3e37e90",
    "tok/test_2018_flickr.lc.norm.tok.en.gz": "6942a488ee2f67a37c7a838ac456addc402a1ba61448c4da317b1bacc9b648eb",
    "tok/test_2018_flickr.lc.norm.tok.fr.gz": "6f33d23fcc44cc3f7ec2b5058e0dcc0b0efc14de01082a37175488073f185eee",
    "tok/train.lc.norm.tok.de.gz": "7e3392f03c0fe978165d22fb5eaf0d0b9b1d9c413283b5193f02d4cb27e50797",
    "tok/train.lc.norm.tok.en.gz": "79d990dd71713faec0e3165cbd3b60acdf6fe11cab2e37a28f374c6bdbb297ec",
    "tok/train.lc.norm.tok.fr.gz": "10438b7694a52af6164448c31198e9453b59a0d3b8a6715428722f0f8fbba2c0",
    "tok/val.lc.norm.tok.de.gz": "006ad58fd6a2ad6502094160fe5273d93abf34a207967fdc69eafd7558b5ef39",
    "tok/val.lc.norm.tok.en.gz": "2c7e5e9cf54ba0dff0cc4b84836d5a583f80ecaaab90b37a123d1376306215cd",
    "tok/val.lc.norm.tok.fr.gz": "78b89a01ca96bb9940c525ad5eb73c0028d3e5bfd90008886a22961afb8e8994",
}
"""SHA-256 of each Multi30k file as stored under ``<root>/multi30k/`` (``shared/data/*/SHA256SUMS``)."""

MULTI30K_TOK_CONTENT_SHA256: dict[str, str] = {
    "tok/test_2016_flickr.lc.norm.tok.de": "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
    "tok/test_2016_flickr.lc.norm.tok.en": "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    "tok/test_2016_flickr.lc.norm.tok.fr": "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836",
    "tok/test_2017_flickr.lc.norm.tok.de": "02067e4a9402786a4fcb8c1b6f4307e4a5073ced64800abead5273b54f5f31f6",
    "tok/test_2017_flickr.lc.norm.tok.en": "c9d1dfd7a26add989382e534af235af9f0f658b2a30e7eb0efdaf142496ee54f",
    "tok/test_2017_flickr.lc.norm.tok.fr": "c0583117a47b31e8a6c6a97cfe8de153e462074668f4e994764fcc80b21d33b4",
    "tok/test_2017_mscoco.lc.norm.tok.de": "e2825990b8a4e5289d2cdba801d57c187810bab9b4f5d87a30c35800a0d871b6",
    "tok/test_2017_mscoco.lc.norm.tok.en": "fe69ae004d71c42ead0301e70c57de5b1b6b5fb7f52210d42b22801e98e656f3",
    "tok/test_2017_mscoco.lc.norm.tok.fr": "0b6a4620f02b6b9acf7811fda23f90fed9c6baa0b96aa224db50a273078c84d1",
    "tok/test_2018_flickr.lc.norm.tok.de": "45ce6b121708adf538d3a8c71dc1acbcb1e0f2bca74ace8e58652f9ea5b96335",
    "tok/test_2018_flickr.lc.norm.tok.en": "a66e25cbb8323d74a40873dcd222659f39e30ee7687a6ed5445833aed0673239",
    "tok/test_2018_flickr.lc.norm.tok.fr": "22d44a4ba21e050f218399f2c4f9e1a36875f209820c1f1c9af5b76a2947a71c",
    "tok/train.lc.norm.tok.de": "cb5a23529b65ec2061f1dc446192a9c37382b63cc75f81a0be59d34894b3a505",
    "tok/train.lc.norm.tok.en": "08925f8e0572bcd5a006702fc5fe20e2d77c6917d4eebd576fc20de6693c2119",
    "tok/train.lc.norm.tok.fr": "8fa41bb718412bcb7c5dfa58603842810a01543eae86a51279f9886b901266e1",
    "tok/val.lc.norm.tok.de": "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
    "tok/val.lc.norm.tok.en": "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
    "tok/val.lc.norm.tok.fr": "b303e301aa21fe7822a846b2b3fb2d5a1121ec807cd5b1d006fb7b2b5507168a",
}
"""SHA-256 of the upstream plain tokenized files (= the decompressed content of our ``tok/*.gz``)."""


def multi30k_relpath(split: str, lang: str, tokenized: bool = False) -> str:
    """Path under ``<root>/multi30k``: ``train.en.gz`` or ``tok/train.lc.norm.tok.en.gz``."""
    return f"tok/{split}.lc.norm.tok.{lang}.gz" if tokenized else f"{split}.{lang}.gz"


def multi30k_url(relpath: str, base_url: str | None = None) -> str:
    """Upstream URL of a local Multi30k file (``base_url`` default :data:`MULTI30K_BASE_URL`, read at call time)."""
    base = (base_url or MULTI30K_BASE_URL).rstrip("/")
    if relpath.startswith("tok/"):
        return f"{base}/{relpath[:-3]}"
    return f"{base}/raw/{relpath}"


def multi30k_splits(src_lang: str, tgt_lang: str, tokenized: bool = False) -> list[str]:
    """Upstream split prefixes that exist for both languages, sorted (``tok/`` has no Czech)."""
    out = []
    for rel in MULTI30K_SHA256:
        if rel.startswith("tok/") != tokenized:
            continue
        name = rel.split("/")[-1]
        split = name.split(".")[0]
        if split not in out and all(
            multi30k_relpath(split, lang, tokenized) in MULTI30K_SHA256 for lang in (src_lang, tgt_lang)
        ):
            out.append(split)
    return out


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (fixed https/http URL)
        return r.read()


def download_multi30k_file(
    root: str | os.PathLike,
    relpath: str,
    *,
    base_url: str | None = None,
    timeout: float = 60.0,
    log: Callable[[str], None] | None = print,
) -> Path:
    """Download one Multi30k file into ``<root>/multi30k/<relpath>``, verified by SHA-256.

    A tokenized file is gzip-compressed deterministically (level 9, mtime 0) after the check.

    Raises:
        DataError: unknown file name, network failure, or a checksum mismatch (nothing is left behind).
    """
    if relpath not in MULTI30K_SHA256:
        raise DataError(f"{relpath!r} is not a Multi30k file")
    dest = Path(root) / "multi30k" / relpath
    url = multi30k_url(relpath, base_url)
    if log:
        log(f"[data] downloading {url} -> {dest}")
    try:
        data = _fetch(url, timeout)
    except (urllib.error.URLError, OSError) as e:
        raise DataError(f"could not download {url}: {e}") from e
    if relpath.startswith("tok/"):
        expected, got = MULTI30K_TOK_CONTENT_SHA256[relpath[:-3]], sha256_bytes(data)
        payload = gzip.compress(data, compresslevel=9, mtime=0)
    else:
        expected, got = MULTI30K_SHA256[relpath], sha256_bytes(data)
        payload = data
    if got != expected:
        raise DataError(
            f"checksum mismatch for {url}: sha256 {got}, expected {expected}; the file was rejected and not saved"
        )
    atomic_write_bytes(dest, payload)
    return dest


def ensure_multi30k(
    root: str | os.PathLike,
    relpaths: Sequence[str],
    *,
    download: bool = True,
    base_url: str | None = None,
    log: Callable[[str], None] | None = print,
) -> list[Path]:
    """The local paths of ``relpaths`` under ``<root>/multi30k``, downloading the missing ones.

    Raises:
        DataError: files missing and ``download`` false or failed (the message names the files and
            ``TRANSFORMER_DATA_DIR``).
    """
    folder = Path(root) / "multi30k"
    paths = [folder / rel for rel in relpaths]
    missing = [rel for rel, p in zip(relpaths, paths) if not p.is_file()]
    if not missing:
        return paths
    hint = (
        f"set {ENV_DATA_DIR} (or data.root) to a folder that holds multi30k/ with these files "
        f"(e.g. {ENV_DATA_DIR}=../shared/data)"
    )
    if not download:
        raise DataError(f"Multi30k files missing under {folder}: {', '.join(missing)}; data.download=false, so {hint}")
    for rel in missing:
        try:
            download_multi30k_file(root, rel, base_url=base_url, log=log)
        except DataError as e:
            raise DataError(
                f"Multi30k files missing under {folder}: {', '.join(missing)}, and the download failed ({e}); {hint}"
            ) from e
    return paths


def verify_multi30k(root: str | os.PathLike) -> dict[str, bool]:
    """``{relpath: ok}`` for every known Multi30k file present under ``root``, checked against its sum."""
    out = {}
    for rel, digest in MULTI30K_SHA256.items():
        p = Path(root) / "multi30k" / rel
        if not p.is_file():
            continue
        if rel.startswith("tok/"):
            out[rel] = sha256_bytes(gzip.decompress(p.read_bytes())) == MULTI30K_TOK_CONTENT_SHA256[rel[:-3]]
        else:
            out[rel] = sha256_file(p) == digest
    return out


def multi30k_excerpt(root: str | os.PathLike, folder: str | os.PathLike, sizes: dict[str, int]) -> Path:
    """The first ``n`` pairs of each raw split in ``sizes`` (e.g. ``{"train": 300}``) as plain
    ``<split>.en`` / ``<split>.de`` files in ``folder``: a small real corpus for the tests.

    Raises:
        DataError: a split's file is missing under ``root``, or holds fewer than ``n`` lines.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        for lang in ("en", "de"):
            source = Path(root) / "multi30k" / multi30k_relpath(split, lang)
            if not source.is_file():
                raise DataError(f"{source}: no such Multi30k file (the data root is {root})")
            with gzip.open(source, "rt", encoding="utf-8") as f:
                lines = [line for _, line in zip(range(n), f)]
            if len(lines) < n:
                raise DataError(f"{source}: {len(lines)} lines, {n} asked for")
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def excerpt_overrides(folder: str | os.PathLike, vocab_size: int) -> list[str]:
    """The ``data.*`` overrides that train on a :func:`multi30k_excerpt` (en->de) with a
    ``vocab_size``-piece tokenizer."""
    return [
        "data=parallel_text",
        f"data.root={folder}",
        "data.src_lang=en",
        "data.tgt_lang=de",
        "data.train_prefix=train",
        "data.valid_prefix=val",
        "data.test_prefix=test_2016_flickr",
        "data.test_splits=[test_2016_flickr]",
        f"data.vocab_size={vocab_size}",
        f"data.cache_dir={folder}/cache",
    ]


__all__ = [
    "ENV_DATA_DIR",
    "MULTI30K_BASE_URL",
    "MULTI30K_SHA256",
    "MULTI30K_TOK_CONTENT_SHA256",
    "download_multi30k_file",
    "ensure_multi30k",
    "excerpt_overrides",
    "multi30k_excerpt",
    "multi30k_relpath",
    "multi30k_splits",
    "multi30k_url",
    "sha256_bytes",
    "sha256_file",
    "verify_multi30k",
]
