"""Where the files of each split live (``{prefix}.{lang}``, plain or gzip), and reading them as the
original lines, which are kept as BLEU references (re-exported from :mod:`transformer.data.reading`).

The data root is ``data.root``, else ``$TRANSFORMER_DATA_DIR``, else
``$XDG_CACHE_HOME/transformer_zoo/data``. Multi30k lives in ``<root>/multi30k/`` (raw) and
``<root>/multi30k/tok/`` (tokenized) and is downloaded there when missing; a ``parallel_text``
corpus is given by prefixes, relative to the root when relative."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformer.data import download as dl
from transformer.data.download import ENV_DATA_DIR
from transformer.data.errors import DataError
from transformer.data.reading import read_bytes, read_lines, read_parallel

CORPORA = ("multi30k", "multi30k_tok", "parallel_text")

# ----------------------------------------------------------------------------- locations


def user_cache_root() -> Path:
    """``$XDG_CACHE_HOME/transformer_zoo`` or ``~/.cache/transformer_zoo`` (not created)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "transformer_zoo"


def data_root(cfg: Any) -> Path:
    """``cfg.root``, else ``$TRANSFORMER_DATA_DIR``, else ``user_cache_root() / "data"``; ``~`` expanded."""
    if cfg.root:
        return Path(str(cfg.root)).expanduser()
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        return Path(env).expanduser()
    return user_cache_root() / "data"


def split_prefixes(cfg: Any) -> dict[str, str]:
    """``{split: prefix}`` in the order train, valid, test (an alias of ``test_prefix``, when set),
    then each of ``test_splits``."""
    out = {"train": str(cfg.train_prefix), "valid": str(cfg.valid_prefix)}
    if cfg.test_prefix:
        out["test"] = str(cfg.test_prefix)
    for name in cfg.test_splits or ():
        out.setdefault(str(name), str(name))
    return out


_REQUIRED_PARALLEL = ("src_lang", "tgt_lang", "train_prefix", "valid_prefix")


def _check_corpus(cfg: Any) -> None:
    """Reject an unknown corpus, and a ``parallel_text`` corpus whose required fields are unset (``""``:
    a YAML ``???`` would not replace :class:`DataConfig`'s defaults when Hydra merges the file)."""
    if cfg.corpus not in CORPORA:
        raise DataError(f"data.corpus={cfg.corpus!r} is not one of {', '.join(CORPORA)}")
    if cfg.corpus == "parallel_text":
        unset = [k for k in _REQUIRED_PARALLEL if str(getattr(cfg, k) or "").strip() in ("", "???")]
        if unset:
            raise DataError(
                f"data=parallel_text needs {', '.join('data.' + k for k in unset)}; e.g. "
                "data.root=/data/wmt14 data.train_prefix=train data.valid_prefix=newstest2013 "
                "data.test_prefix=newstest2014 data.src_lang=en data.tgt_lang=de"
            )


def _multi30k_split_names(cfg: Any) -> dict[str, str]:
    """Split name -> prefix for a Multi30k corpus: configured names plus every upstream test set
    that exists for both languages."""
    tokenized = cfg.corpus == "multi30k_tok"
    known = set(dl.multi30k_splits(cfg.src_lang, cfg.tgt_lang, tokenized=tokenized))
    out = {name: p for name, p in split_prefixes(cfg).items() if p in known}
    for prefix in dl.multi30k_splits(cfg.src_lang, cfg.tgt_lang, tokenized=tokenized):
        if prefix not in (cfg.train_prefix, cfg.valid_prefix):
            out.setdefault(prefix, prefix)
    return out


def _candidates(prefix: Path, lang: str) -> list[Path]:
    return [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]


def _parallel_prefix(cfg: Any, prefix: str) -> Path:
    p = Path(prefix).expanduser()
    return p if p.is_absolute() else data_root(cfg) / p


def _existing(prefix: Path, lang: str) -> Path | None:
    for c in _candidates(prefix, lang):
        if c.is_file():
            return c
    return None


def available_splits(cfg: Any) -> list[str]:
    """Split names :func:`resolve_split_files` accepts: Multi30k's configured splits plus every upstream
    test set of both languages; for ``parallel_text`` the configured splits whose files exist.

    Raises:
        DataError: an unknown ``data.corpus``.
    """
    _check_corpus(cfg)
    if cfg.corpus in ("multi30k", "multi30k_tok"):
        return list(_multi30k_split_names(cfg))
    names = []
    for name, prefix in split_prefixes(cfg).items():
        p = _parallel_prefix(cfg, prefix)
        if _existing(p, cfg.src_lang) and _existing(p, cfg.tgt_lang):
            names.append(name)
    return names


def resolve_split_files(cfg: Any, split: str, *, download: bool | None = None) -> tuple[Path, Path]:
    """``(src_path, tgt_path)`` of a split, downloading missing Multi30k files unless ``download``
    (default ``cfg.download``) is false.

    Raises:
        DataError: an unknown split or missing files (the available splits listed), or Multi30k files
            that cannot be downloaded (``TRANSFORMER_DATA_DIR`` named).
    """
    _check_corpus(cfg)
    if cfg.corpus in ("multi30k", "multi30k_tok"):
        names = _multi30k_split_names(cfg)
        if split not in names:
            raise DataError(
                f"split {split!r} is not available for {cfg.corpus} {cfg.src_lang}-{cfg.tgt_lang}; "
                f"available splits: {', '.join(names)}"
            )
        tokenized = cfg.corpus == "multi30k_tok"
        root = data_root(cfg)
        rel = [dl.multi30k_relpath(names[split], lang, tokenized) for lang in (cfg.src_lang, cfg.tgt_lang)]
        paths = dl.ensure_multi30k(root, rel, download=cfg.download if download is None else download)
        return paths[0], paths[1]

    prefixes = split_prefixes(cfg)
    if split not in prefixes:
        raise DataError(
            f"split {split!r} is not configured for data.name={cfg.name}; available splits: "
            f"{', '.join(available_splits(cfg)) or '(none)'}"
        )
    prefix = _parallel_prefix(cfg, prefixes[split])
    found = [_existing(prefix, lang) for lang in (cfg.src_lang, cfg.tgt_lang)]
    if None in found:
        looked = [str(c) for lang in (cfg.src_lang, cfg.tgt_lang) for c in _candidates(prefix, lang)]
        raise DataError(
            f"files of split {split!r} not found (looked for {', '.join(looked)}); available "
            f"splits: {', '.join(available_splits(cfg)) or '(none)'}"
        )
    return found[0], found[1]  # type: ignore[return-value]


__all__ = [
    "CORPORA",
    "ENV_DATA_DIR",
    "DataError",
    "available_splits",
    "data_root",
    "read_bytes",
    "read_lines",
    "read_parallel",
    "resolve_split_files",
    "split_prefixes",
    "user_cache_root",
]
