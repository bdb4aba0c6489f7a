"""Load a translation corpus: files -> SentencePiece model(s) -> encoded, cached splits.

:func:`load_translation_data` is the one entry point used by training, evaluation and
translation. It

1. resolves (and for Multi30k downloads) the files of every requested split
   (:func:`~transformer.data.corpus.resolve_split_files`);
2. trains a SentencePiece model on the training split (joint over source and target, or one per
   side with ``data.joint_vocab=false``), or loads it from the cache;
3. encodes every split, or loads it from the cache (training pairs with an empty side are
   dropped; validation and test splits keep every line, so that outputs stay line-aligned with
   their files);
4. removes training pairs longer than ``data.max_source_positions`` /
   ``data.max_target_positions`` (validation and test sets are kept whole).

Cache layout (``data.cache_dir``, default ``~/.cache/transformer_zoo/cache``)::

    <cache>/<data.name>-<key>/options.json       what the key was computed from
    <cache>/<data.name>-<key>/spm.model          joint model (or spm.src.model + spm.tgt.model)
    <cache>/<data.name>-<key>/split-<hash>.pkl   one encoded split (ids + original lines)

``key`` hashes the SHA-256 of the two training files' contents and every option that changes the
vocabulary (corpus, languages, vocab size, model type, joint, coverage, lowercase, the
SentencePiece version); ``<hash>`` hashes the split's two files. Changed inputs therefore rebuild,
and a second run only reads files and unpickles. Building holds a file lock in the cache folder,
so concurrent ranks wait for one another instead of racing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import sentencepiece as spm

from transformer.data.corpus import (
    available_splits,
    read_parallel,
    resolve_split_files,
    split_prefixes,
    user_cache_root,
)
from transformer.data.download import sha256_file
from transformer.data.tokenizer import Tokenizer

CACHE_VERSION = 1


@dataclass
class ParallelDataset:
    """One split of a parallel corpus.

    Attributes:
        src: source ids per example, without specials (no BOS/EOS).
        tgt: target ids per example, without specials.
        src_text: the original source lines (raw, as in the file).
        tgt_text: the original target lines: the BLEU references.
        name: split name (``train``, ``valid``, ``test_2016_flickr``, ...).
    """

    src: list[list[int]]
    tgt: list[list[int]]
    src_text: list[str]
    tgt_text: list[str]
    name: str

    def __len__(self) -> int:
        """Number of examples."""
        return len(self.src)

    @property
    def src_lengths(self) -> list[int]:
        """Source lengths in pieces (no specials)."""
        return [len(s) for s in self.src]

    @property
    def tgt_lengths(self) -> list[int]:
        """Target lengths in pieces (no specials)."""
        return [len(t) for t in self.tgt]

    def subset(self, indices: Sequence[int], name: str | None = None) -> "ParallelDataset":
        """A new dataset with the examples ``indices`` (in that order).

        Args:
            indices: example indices.
            name: name of the result (defaults to this name).

        Returns:
            A :class:`ParallelDataset` sharing the id lists (not copied).
        """
        return ParallelDataset(
            src=[self.src[i] for i in indices],
            tgt=[self.tgt[i] for i in indices],
            src_text=[self.src_text[i] for i in indices],
            tgt_text=[self.tgt_text[i] for i in indices],
            name=self.name if name is None else name,
        )


@dataclass
class TranslationData:
    """Everything a run needs from the data side.

    Attributes:
        src_tokenizer: source vocabulary.
        tgt_tokenizer: target vocabulary (the same object as ``src_tokenizer`` when joint).
        splits: ``"train"``, ``"valid"``, each test split by its name (e.g.
            ``"test_2016_flickr"``) and ``"test"`` (an alias of the ``data.test_prefix`` split,
            the same object), as requested.
        stats: ``dropped_empty`` {split: pairs dropped for an empty side},
            ``filtered_by_length`` {"train": pairs removed}, ``over_length`` {split: kept pairs
            longer than the position limits, valid/test only}, ``sizes`` {split: pairs},
            ``files`` {split: [src, tgt]}, ``cache`` ("hit" when nothing was built, else "miss"),
            ``tokenizer_cache`` and ``split_cache`` (hit/miss each), ``cache_dir``, ``seconds``.
    """

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    splits: dict[str, ParallelDataset]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def joint_vocab(self) -> bool:
        """Whether source and target share one tokenizer."""
        return self.src_tokenizer is self.tgt_tokenizer


# ----------------------------------------------------------------------------- helpers

_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, memoised per process by (path, size, mtime).

    Args:
        path: the file.

    Returns:
        64 hex digits.
    """
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(p)
    return _DIGESTS[key]


def cache_root(cfg: Any) -> Path:
    """The cache folder: ``data.cache_dir`` or ``~/.cache/transformer_zoo/cache``.

    Args:
        cfg: a :class:`~transformer.config.DataConfig`.

    Returns:
        The folder (not created here).
    """
    return Path(str(cfg.cache_dir)).expanduser() if cfg.cache_dir else user_cache_root() / "cache"


def default_splits(cfg: Any) -> list[str]:
    """Splits loaded when none are requested: train, valid, test (if set) and every test split.

    Args:
        cfg: a :class:`~transformer.config.DataConfig`.

    Returns:
        Split names.
    """
    return list(split_prefixes(cfg))


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


def _atomic_pickle(obj: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _vocab_options(cfg: Any, train_files: tuple[Path, Path]) -> dict[str, Any]:
    return {
        "cache_version": CACHE_VERSION,
        "sentencepiece": spm.__version__,
        "corpus": str(cfg.corpus),
        "src_lang": str(cfg.src_lang),
        "tgt_lang": str(cfg.tgt_lang),
        "vocab_size": int(cfg.vocab_size),
        "spm_model_type": str(cfg.spm_model_type),
        "joint_vocab": bool(cfg.joint_vocab),
        "character_coverage": float(cfg.character_coverage),
        "lowercase": bool(cfg.lowercase),
        "train_sha256": [file_digest(p) for p in train_files],
    }


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- entry point


def load_translation_data(
    cfg: Any,
    splits: Sequence[str] | None = None,
    log: Callable[[str], None] | None = print,
) -> TranslationData:
    """Load (building or reading the cache) the tokenizers and encoded splits of a corpus.

    Args:
        cfg: a :class:`~transformer.config.DataConfig`.
        splits: split names (see :func:`~transformer.data.corpus.available_splits`); ``None``
            loads :func:`default_splits`. The training files are always needed for the
            vocabulary, but the train split is only returned when requested.
        log: called with a few progress lines; ``None`` for silence.

    Returns:
        A :class:`TranslationData`. Training pairs with ``len(src) + 1 > max_source_positions``
        or ``len(tgt) + 1 > max_target_positions`` (the ``+ 1`` is EOS / BOS) are removed and
        counted; other splits keep every pair (those over the limits are counted in
        ``stats["over_length"]``).

    Raises:
        DataError: a split is unknown or missing (the message lists the available splits), files
            are missing and cannot be downloaded, a file is not valid UTF-8, or parallel files
            have different line counts.
        ValueError: invalid SentencePiece options.
    """
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    names = list(dict.fromkeys(splits if splits is not None else default_splits(cfg)))

    # 1. files (fail fast on an unknown split, before training anything)
    train_files = resolve_split_files(cfg, "train")
    files = {name: (train_files if name == "train" else resolve_split_files(cfg, name)) for name in names}

    # 2. vocabulary
    options = _vocab_options(cfg, train_files)
    folder = cache_root(cfg) / f"{cfg.name}-{_hash(options)[:16]}"
    stats: dict[str, Any] = {
        "cache_dir": str(folder),
        "split_cache": {},
        "dropped_empty": {},
        "filtered_by_length": {},
        "over_length": {},
        "sizes": {},
        "files": {name: [str(p) for p in fs] for name, fs in files.items()},
    }
    read_cache: dict[tuple[Path, Path, bool], tuple[list[str], list[str], int]] = {}

    def read(fs: tuple[Path, Path], keep_empty: bool = False) -> tuple[list[str], list[str], int]:
        # evaluation splits keep empty lines: outputs stay line-aligned with the input files
        if (*fs, keep_empty) not in read_cache:
            read_cache[(*fs, keep_empty)] = read_parallel(*fs, keep_empty=keep_empty)
        return read_cache[(*fs, keep_empty)]

    with _locked(folder):
        if cfg.joint_vocab:
            model_files = {"joint": folder / "spm.model"}
        else:
            model_files = {"src": folder / "spm.src.model", "tgt": folder / "spm.tgt.model"}
        hit = all(p.is_file() for p in model_files.values())
        stats["tokenizer_cache"] = "hit" if hit else "miss"
        if not hit:
            t = time.perf_counter()
            src_lines, tgt_lines, _ = read(train_files)
            inputs = {"joint": src_lines + tgt_lines, "src": src_lines, "tgt": tgt_lines}
            for side, path in model_files.items():
                Tokenizer.train(
                    inputs[side],
                    str(path)[: -len(".model")],
                    vocab_size=int(cfg.vocab_size),
                    model_type=str(cfg.spm_model_type),
                    character_coverage=float(cfg.character_coverage),
                    lowercase=bool(cfg.lowercase),
                )
            (folder / "options.json").write_text(json.dumps(options, indent=1, sort_keys=True))
            say(f"[data] trained SentencePiece {cfg.spm_model_type} ({'joint' if cfg.joint_vocab else 'per side'}, "
                f"vocab {cfg.vocab_size}) in {time.perf_counter() - t:.1f}s")
        if cfg.joint_vocab:
            src_tok = tgt_tok = Tokenizer(model_files["joint"])
        else:
            src_tok, tgt_tok = Tokenizer(model_files["src"]), Tokenizer(model_files["tgt"])

        # 3. encoded splits (one object per distinct pair of files)
        by_files: dict[tuple[Path, Path, bool], ParallelDataset] = {}
        out: dict[str, ParallelDataset] = {}
        for name in names:
            fs = files[name]
            keep_empty = name != "train"  # evaluation splits stay line-aligned with their files
            if (*fs, keep_empty) in by_files:  # an alias ("test") of a split already loaded
                first = next(k for k in out if files[k] == fs and (k != "train") == keep_empty)
                out[name] = by_files[(*fs, keep_empty)]
                stats["split_cache"][name] = stats["split_cache"][first]
                stats["dropped_empty"][name] = stats["dropped_empty"][first]
                continue
            key = [file_digest(p) for p in fs] + (["keep_empty"] if keep_empty else [])
            path = folder / f"split-{_hash(key)[:16]}.pkl"
            payload = None
            if path.is_file():
                try:
                    with open(path, "rb") as f:
                        payload = pickle.load(f)
                except Exception:  # a damaged cache file is rebuilt
                    payload = None
            stats["split_cache"][name] = "hit" if payload is not None else "miss"
            if payload is None:
                s_text, t_text, dropped = read(fs, keep_empty)
                payload = {
                    "src": src_tok.encode_batch(s_text),
                    "tgt": tgt_tok.encode_batch(t_text),
                    "src_text": s_text,
                    "tgt_text": t_text,
                    "dropped": dropped,
                    "files": [str(p) for p in fs],
                }
                _atomic_pickle(payload, path)
            display = split_prefixes(cfg).get(name, name) if name == "test" else name
            ds = ParallelDataset(payload["src"], payload["tgt"], payload["src_text"], payload["tgt_text"], display)
            stats["dropped_empty"][name] = payload["dropped"]
            by_files[(*fs, keep_empty)] = out[name] = ds

    # 4. length filter (train only) and counts
    max_src, max_tgt = int(cfg.max_source_positions), int(cfg.max_target_positions)
    for name, ds in list(out.items()):
        fits = [len(s) + 1 <= max_src and len(t) + 1 <= max_tgt for s, t in zip(ds.src, ds.tgt)]
        n_over = len(fits) - sum(fits)
        if name == "train":
            if n_over:
                ds = ds.subset([i for i, ok in enumerate(fits) if ok])
                out[name] = ds
            stats["filtered_by_length"]["train"] = n_over
        else:
            stats["over_length"][name] = n_over
        stats["sizes"][name] = len(ds)

    stats["cache"] = "hit" if stats["tokenizer_cache"] == "hit" and all(
        v == "hit" for v in stats["split_cache"].values()
    ) else "miss"
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    stats["vocab_size"] = {"src": len(src_tok), "tgt": len(tgt_tok)}
    parts = []
    for name, ds in out.items():
        extra = [f"{stats['dropped_empty'][name]} empty dropped"] if stats["dropped_empty"][name] else []
        if name == "train" and stats["filtered_by_length"]["train"]:
            extra.append(f"{stats['filtered_by_length']['train']} over length removed")
        if stats["over_length"].get(name):
            extra.append(f"{stats['over_length'][name]} over length kept")
        parts.append(f"{name} {len(ds)}" + (f" ({', '.join(extra)})" if extra else ""))
    vocab = f"{len(src_tok)} joint" if src_tok is tgt_tok else f"{len(src_tok)}/{len(tgt_tok)}"
    say(f"[data] {cfg.name}: {'; '.join(parts)}; vocab {vocab}; cache {stats['cache']} "
        f"({folder}) in {stats['seconds']:.2f}s")
    return TranslationData(src_tokenizer=src_tok, tgt_tokenizer=tgt_tok, splits=out, stats=stats)


__all__ = [
    "CACHE_VERSION",
    "ParallelDataset",
    "TranslationData",
    "available_splits",
    "cache_root",
    "default_splits",
    "file_digest",
    "load_translation_data",
]
