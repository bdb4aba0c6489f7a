"""The binarized-data cache: one folder per corpus and vocabulary,
``<data.cache_dir>/<data.name>-<key>/`` (``manifest.json``, the SentencePiece model(s), one
``split-<hash>/`` per split), built once and found again. ``key`` hashes the training files'
contents and every vocabulary option, ``<hash>`` a split's files and options, so changed inputs
rebuild; a file lock makes concurrent ranks wait for one build. docs/switches.md#the-data-pipeline."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from transformer.data.binarize import binarize_split, read_manifest
from transformer.data.corpus import resolve_split_files, user_cache_root
from transformer.data.download import sha256_file
from transformer.data.errors import DataError
from transformer.data.reading import iter_parallel
from transformer.data.tokenizer import Tokenizer
from transformer.runs.io import atomic_write_text

CACHE_VERSION = 2
FOLDER_FORMAT = "transformer-zoo/binarized"
DEFAULT_SPM_SAMPLE = 2_000_000

_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, memoised per process by (path, size, mtime)."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(p)
    return _DIGESTS[key]


def cache_root(cfg: Any) -> Path:
    """``data.cache_dir`` or ``~/.cache/transformer_zoo/cache`` (not created)."""
    return Path(str(cfg.cache_dir)).expanduser() if cfg.cache_dir else user_cache_root() / "cache"


def preprocess_workers(cfg: Any) -> int:
    """Encoding processes for ``cfg``: ``data.preprocess_workers``, or one per usable CPU when 0."""
    n = int(getattr(cfg, "preprocess_workers", 0) or 0)
    return n if n > 0 else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(folder / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove_stale_temporaries(folder: Path) -> None:
    """Remove what an interrupted build left behind (called with the folder's lock held)."""
    for p in folder.glob(".*.tmp"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


_VOCAB_FIELDS = (
    "corpus",
    "src_lang",
    "tgt_lang",
    "vocab_size",
    "spm_model_type",
    "joint_vocab",
    "character_coverage",
    "lowercase",
    "spm_input_sentence_size",
)


def _vocab_fields(cfg: Any) -> dict[str, Any]:
    out = {k: getattr(cfg, k, None) for k in _VOCAB_FIELDS}
    out["spm_input_sentence_size"] = int(out["spm_input_sentence_size"] or DEFAULT_SPM_SAMPLE)
    return {k: (v if isinstance(v, (bool, int, float)) else str(v)) for k, v in out.items()}


def _vocab_options(cfg: Any, train_files: tuple[Path, Path]) -> dict[str, Any]:
    return {
        "cache_version": CACHE_VERSION,
        "sentencepiece": spm.__version__,
        **_vocab_fields(cfg),
        "train_sha256": [file_digest(p) for p in train_files],
    }


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _model_files(folder: Path, joint: bool) -> dict[str, Path]:
    if joint:
        return {"joint": folder / "spm.model"}
    return {"src": folder / "spm.src.model", "tgt": folder / "spm.tgt.model"}


def _training_sentences(files: tuple[Path, Path], sides: Sequence[int]) -> Iterator[str]:
    """Lines of the kept training pairs, side after side (one streaming pass per side)."""
    n_lines = n_kept = 0
    for k in sides:
        for chunk in iter_parallel(*files, drop_empty=True):
            if k == sides[0]:
                n_lines, n_kept = n_lines + chunk.n_read, n_kept + len(chunk.src)
            yield from (chunk.src, chunk.tgt)[k]
        if n_kept == 0:
            raise DataError(no_pairs_message(files, n_lines))


def no_pairs_message(files: Sequence[Any], n_lines: int) -> str:
    """The error for training files without a non-empty pair (names both files)."""
    why = f"all {n_lines} lines have an empty side" if n_lines else "the files are empty"
    return f"no non-empty sentence pairs in the training files {files[0]} and {files[1]} ({why}); nothing to train on"


def _train_tokenizers(cfg: Any, folder: Path, train_files: tuple[Path, Path], say: Callable[[str], None]) -> bool:
    """Train the SentencePiece model(s) into ``folder`` unless present; returns whether they were."""
    model_files = _model_files(folder, bool(cfg.joint_vocab))
    if all(p.is_file() for p in model_files.values()):
        return True
    t = time.perf_counter()
    sides = {"joint": (0, 1), "src": (0,), "tgt": (1,)}
    for side, path in model_files.items():
        Tokenizer.train(
            _training_sentences(train_files, sides[side]),
            str(path)[: -len(".model")],
            vocab_size=int(cfg.vocab_size),
            model_type=str(cfg.spm_model_type),
            character_coverage=float(cfg.character_coverage),
            lowercase=bool(cfg.lowercase),
            input_sentence_size=_vocab_fields(cfg)["spm_input_sentence_size"],
        )
    say(
        f"[data] trained SentencePiece {cfg.spm_model_type} ({'joint' if cfg.joint_vocab else 'per side'}, "
        f"vocab {cfg.vocab_size}) in {time.perf_counter() - t:.1f}s"
    )
    return False


def load_tokenizers(folder: Path, joint: bool) -> tuple[Tokenizer, Tokenizer]:
    """``(src, tgt)`` tokenizers of a binarized folder (the same object twice when ``joint``)."""
    files = _model_files(folder, joint)
    if joint:
        tok = Tokenizer(files["joint"])
        return tok, tok
    return Tokenizer(files["src"]), Tokenizer(files["tgt"])


def _split_key(digests: list[str], keep_text: bool, drop_empty: bool) -> str:
    return _hash({"version": CACHE_VERSION, "files": digests, "keep_text": keep_text, "drop_empty": drop_empty})[:16]


def build(cfg: Any, names: list[str], say: Callable[[str], None]) -> tuple[Path, dict[str, Path], dict[str, str], bool]:
    """Find or build the vocabulary and every split of ``names`` in the cache.

    Returns:
        ``(folder, split_dirs, split_cache, tokenizer_hit)``: the binarized folder, ``{split: folder}``,
        ``{split: "hit" | "miss"}``, and whether the vocabulary was there.

    Raises:
        DataError: unknown or missing splits, unreadable files (file and line named), parallel files of
            different lengths, or no non-empty training pair.
    """
    # files first (fail fast on an unknown split, before training anything)
    train_files = resolve_split_files(cfg, "train")
    files = {name: (train_files if name == "train" else resolve_split_files(cfg, name)) for name in names}
    options = _vocab_options(cfg, train_files)
    folder = cache_root(cfg) / f"{cfg.name}-{_hash(options)[:16]}"
    split_dirs: dict[str, Path] = {}
    split_cache: dict[str, str] = {}
    with _locked(folder):
        _remove_stale_temporaries(folder)
        tok_hit = _train_tokenizers(cfg, folder, train_files, say)
        tokenizers = load_tokenizers(folder, bool(cfg.joint_vocab))
        for name in names:
            fs = files[name]
            # evaluation splits keep their text (BLEU references) and every line, so that
            # outputs stay line-aligned with their files; training drops pairs with an empty side
            drop_empty = name == "train"
            keep_text = not drop_empty
            digests = [file_digest(p) for p in fs]
            d = folder / f"split-{_split_key(digests, keep_text, drop_empty)}"
            hit = read_manifest(d) is not None
            if not hit:
                binarize_split(
                    fs[0],
                    fs[1],
                    tokenizers,
                    d,
                    keep_text=keep_text,
                    drop_empty=drop_empty,
                    workers=preprocess_workers(cfg),
                    inputs=[{"path": str(p), "sha256": h, "bytes": p.stat().st_size} for p, h in zip(fs, digests)],
                    options={"vocab": options},
                    log=say,
                )
            split_dirs[name], split_cache[name] = d, "hit" if hit else "miss"
        top = folder / "manifest.json"
        previous = json.loads(top.read_text()).get("splits", {}) if top.is_file() else {}
        atomic_write_text(
            top,
            json.dumps(
                {
                    "format": FOLDER_FORMAT,
                    "version": CACHE_VERSION,
                    "data": _vocab_fields(cfg),
                    "name": str(cfg.name),
                    "vocab": options,
                    "tokenizers": {k: p.name for k, p in _model_files(folder, bool(cfg.joint_vocab)).items()},
                    "splits": {**previous, **{n: d.name for n, d in split_dirs.items()}},
                },
                indent=1,
            )
            + "\n",
        )
    return folder, split_dirs, split_cache, tok_hit


def find_binarized(cfg: Any, folder: Path, names: list[str]) -> dict[str, Path]:
    """``{split: folder}`` of ``names`` in a ``data.binarized`` folder built with ``cfg``'s data options.

    Raises:
        DataError: no readable manifest, other vocabulary options (named), or a missing split (those
            it has listed).
    """
    top = folder / "manifest.json"
    try:
        manifest = json.loads(top.read_text())
    except (OSError, ValueError) as e:
        raise DataError(
            f"data.binarized={folder} holds no readable manifest.json ({e.__class__.__name__}); build the "
            "folder with python scripts/preprocess.py (same data options), which prints its path"
        ) from e
    if manifest.get("format") != FOLDER_FORMAT or manifest.get("version") != CACHE_VERSION:
        raise DataError(f"data.binarized={folder}: {top} is not a binarized data manifest of version {CACHE_VERSION}")
    built, wanted = manifest["data"], _vocab_fields(cfg)
    differ = [k for k in _VOCAB_FIELDS if built.get(k) != wanted[k]]
    if differ:
        raise DataError(
            f"data.binarized={folder} was built with other data options: "
            + ", ".join(f"data.{k}={built.get(k)!r} there, {wanted[k]!r} here" for k in differ)
            + "; pass the data options used for preprocessing"
        )
    missing = [n for n in names if n not in manifest["splits"]]
    if missing:
        raise DataError(
            f"split(s) {', '.join(missing)} not in data.binarized={folder}; available splits: "
            f"{', '.join(manifest['splits'])} (preprocess them with scripts/preprocess.py splits=[...])"
        )
    return {n: folder / manifest["splits"][n] for n in names}


__all__ = [
    "CACHE_VERSION",
    "build",
    "cache_root",
    "file_digest",
    "find_binarized",
    "load_tokenizers",
    "no_pairs_message",
    "preprocess_workers",
]
