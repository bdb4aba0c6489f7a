"""Load a translation corpus: files -> SentencePiece model(s) -> binarized, memory-mapped splits.

:func:`load_translation_data` is the one entry point used by training (and by
``scripts/preprocess.py``, which only builds). It

1. resolves (and for Multi30k downloads) the files of every requested split
   (:func:`~transformer.data.corpus.resolve_split_files`);
2. trains a SentencePiece model on the training split (joint over source and target, or one per
   side with ``data.joint_vocab=false``), streaming the files, or loads it from the cache;
3. binarizes every split (:func:`~transformer.data.binarize.binarize_split`: flat ``uint16`` /
   ``int32`` token arrays + offsets, written atomically, encoded in worker processes), or finds
   it in the cache, and maps it read-only (training pairs with an empty side are dropped;
   validation and test splits keep every line, so that outputs stay line-aligned with their
   files, and keep their raw text);
4. removes training pairs longer than ``data.max_source_positions`` /
   ``data.max_target_positions`` (validation and test sets are kept whole).

Cache layout (``data.cache_dir``, default ``~/.cache/transformer_zoo/cache``): the cache *is*
the binarized data, for Multi30k and for a WMT-size ``parallel_text`` corpus alike::

    <cache>/<data.name>-<key>/manifest.json    data options, vocabulary options, split -> folder
    <cache>/<data.name>-<key>/spm.model        joint model (or spm.src.model + spm.tgt.model)
    <cache>/<data.name>-<key>/split-<hash>/    one binarized split (see transformer.data.binarize)

``key`` hashes the SHA-256 of the two training files' contents and every option that changes the
vocabulary (corpus, languages, vocab size, model type, joint, coverage, lowercase, sample size,
the SentencePiece version); ``<hash>`` hashes the split's two files and whether it keeps its text.
Changed inputs therefore rebuild. Building holds a file lock in the folder, so concurrent ranks
wait for one another instead of racing. With ``data.binarized=<folder>`` such a folder is read
directly (no raw file is read or hashed): the way to train on a corpus preprocessed once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from transformer.data.binarize import TokenSequences, binarize_split, load_split, read_manifest
from transformer.data.corpus import resolve_split_files, split_prefixes, user_cache_root
from transformer.data.download import sha256_file
from transformer.data.errors import DataError
from transformer.data.reading import iter_parallel
from transformer.data.tokenizer import Tokenizer
from transformer.io import atomic_write_text

CACHE_VERSION = 2
FOLDER_FORMAT = "transformer-zoo/binarized"
DEFAULT_SPM_SAMPLE = 2_000_000


@dataclass
class ParallelDataset:
    """One split of a parallel corpus.

    Attributes:
        src: source ids per example, without specials (no BOS/EOS): a
            :class:`~transformer.data.binarize.TokenSequences` over memory-mapped arrays, or any
            sequence of id lists.
        tgt: target ids per example, without specials.
        src_text: the original source lines (raw, as in the file); ``None`` for the training
            split, whose text is not kept.
        tgt_text: the original target lines: the BLEU references (``None`` for training).
        name: split name (``train``, ``valid``, ``test_2016_flickr``, ...).
    """

    src: Sequence[Sequence[int]]
    tgt: Sequence[Sequence[int]]
    src_text: list[str] | None
    tgt_text: list[str] | None
    name: str

    def __len__(self) -> int:
        """Number of examples."""
        return len(self.src)

    @staticmethod
    def _lengths(seqs: Sequence[Sequence[int]]) -> np.ndarray:
        if isinstance(seqs, TokenSequences):
            return seqs.lengths
        return np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))

    @property
    def src_lengths(self) -> np.ndarray:
        """``(n,)`` int64 source lengths in pieces (no specials)."""
        return self._lengths(self.src)

    @property
    def tgt_lengths(self) -> np.ndarray:
        """``(n,)`` int64 target lengths in pieces (no specials)."""
        return self._lengths(self.tgt)

    def subset(self, indices: Sequence[int] | np.ndarray, name: str | None = None) -> "ParallelDataset":
        """A new dataset with the examples ``indices`` (in that order).

        Args:
            indices: example indices.
            name: name of the result (defaults to this name).

        Returns:
            A :class:`ParallelDataset` sharing the token arrays (not copied).
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)

        def pick(seqs: Any) -> Any:
            if seqs is None:
                return None
            if isinstance(seqs, TokenSequences):
                return seqs.subset(idx)
            return [seqs[i] for i in idx.tolist()]

        return ParallelDataset(pick(self.src), pick(self.tgt), pick(self.src_text), pick(self.tgt_text),
                               self.name if name is None else name)


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
            ``tokenizer_cache`` and ``split_cache`` (hit/miss each), ``cache_dir`` (the binarized
            folder), ``split_dirs`` {split: folder}, ``seconds``, ``vocab_size``.
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


_VOCAB_FIELDS = ("corpus", "src_lang", "tgt_lang", "vocab_size", "spm_model_type", "joint_vocab",
                 "character_coverage", "lowercase", "spm_input_sentence_size")


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
            raise DataError(_no_pairs_message(files, n_lines))


def _no_pairs_message(files: Sequence[Any], n_lines: int) -> str:
    why = f"all {n_lines} lines have an empty side" if n_lines else "the files are empty"
    return (f"no non-empty sentence pairs in the training files {files[0]} and {files[1]} ({why}); "
            "nothing to train on")


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
    say(f"[data] trained SentencePiece {cfg.spm_model_type} ({'joint' if cfg.joint_vocab else 'per side'}, "
        f"vocab {cfg.vocab_size}) in {time.perf_counter() - t:.1f}s")
    return False


def _load_tokenizers(folder: Path, joint: bool) -> tuple[Tokenizer, Tokenizer]:
    files = _model_files(folder, joint)
    if joint:
        tok = Tokenizer(files["joint"])
        return tok, tok
    return Tokenizer(files["src"]), Tokenizer(files["tgt"])


# ----------------------------------------------------------------------------- entry point


def load_translation_data(
    cfg: Any,
    splits: Sequence[str] | None = None,
    log: Callable[[str], None] | None = print,
) -> TranslationData:
    """Load (building or reading the cache) the tokenizers and binarized splits of a corpus.

    Args:
        cfg: a :class:`~transformer.config.DataConfig`.
        splits: split names (see :func:`~transformer.data.corpus.available_splits`); ``None``
            loads :func:`default_splits`. The training files are always needed for the
            vocabulary (unless ``data.binarized`` is set), but the train split is only returned
            when requested.
        log: called with a few progress lines; ``None`` for silence.

    Returns:
        A :class:`TranslationData`. Training pairs with ``len(src) + 1 > max_source_positions``
        or ``len(tgt) + 1 > max_target_positions`` (the ``+ 1`` is EOS / BOS) are removed and
        counted; other splits keep every pair (those over the limits are counted in
        ``stats["over_length"]``).

    Raises:
        DataError: a split is unknown or missing (the message lists the available splits), files
            are missing and cannot be downloaded, a file is not valid UTF-8 (names file and
            line), parallel files have different line counts, the training files hold no
            non-empty pair or the validation split is empty (names the files), or
            ``data.binarized`` is not a folder built with these data options.
        ValueError: invalid SentencePiece options.
    """
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    names = list(dict.fromkeys(splits if splits is not None else default_splits(cfg)))
    if getattr(cfg, "binarized", None):
        folder = Path(str(cfg.binarized)).expanduser()
        split_dirs, split_cache, tok_hit = _find_binarized(cfg, folder, names), {n: "hit" for n in names}, True
    else:
        folder, split_dirs, split_cache, tok_hit = _build(cfg, names, say)
    return _assemble(cfg, folder, split_dirs, split_cache, tok_hit, say, t0)


def _split_key(digests: list[str], keep_text: bool, drop_empty: bool) -> str:
    return _hash({"version": CACHE_VERSION, "files": digests, "keep_text": keep_text, "drop_empty": drop_empty})[:16]


def _build(cfg: Any, names: list[str], say: Callable[[str], None]) -> tuple[Path, dict[str, Path], dict[str, str], bool]:
    """Find or build the vocabulary and every split of ``names`` in the cache."""
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
        tokenizers = _load_tokenizers(folder, bool(cfg.joint_vocab))
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
                    fs[0], fs[1], tokenizers, d, keep_text=keep_text, drop_empty=drop_empty,
                    workers=preprocess_workers(cfg),
                    inputs=[{"path": str(p), "sha256": h, "bytes": p.stat().st_size} for p, h in zip(fs, digests)],
                    options={"vocab": options}, log=say,
                )
            split_dirs[name], split_cache[name] = d, "hit" if hit else "miss"
        top = folder / "manifest.json"
        previous = json.loads(top.read_text()).get("splits", {}) if top.is_file() else {}
        atomic_write_text(top, json.dumps({
            "format": FOLDER_FORMAT,
            "version": CACHE_VERSION,
            "data": _vocab_fields(cfg),
            "name": str(cfg.name),
            "vocab": options,
            "tokenizers": {k: p.name for k, p in _model_files(folder, bool(cfg.joint_vocab)).items()},
            "splits": {**previous, **{n: d.name for n, d in split_dirs.items()}},
        }, indent=1) + "\n")
    return folder, split_dirs, split_cache, tok_hit


def _find_binarized(cfg: Any, folder: Path, names: list[str]) -> dict[str, Path]:
    """The split folders of ``names`` in a binarized folder built with ``cfg``'s data options."""
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


def _assemble(
    cfg: Any, folder: Path, split_dirs: dict[str, Path], split_cache: dict[str, str], tok_hit: bool,
    say: Callable[[str], None], t0: float,
) -> TranslationData:
    """Map the split folders, apply the training length filter, count, and log one line."""
    src_tok, tgt_tok = _load_tokenizers(folder, bool(cfg.joint_vocab))
    stats: dict[str, Any] = {
        "cache_dir": str(folder), "split_dirs": {n: str(d) for n, d in split_dirs.items()},
        "split_cache": split_cache, "tokenizer_cache": "hit" if tok_hit else "miss",
        "dropped_empty": {}, "filtered_by_length": {}, "over_length": {}, "sizes": {}, "files": {},
    }
    by_dir: dict[Path, tuple[ParallelDataset, dict[str, Any]]] = {}
    out: dict[str, ParallelDataset] = {}
    for name, d in split_dirs.items():
        if d not in by_dir:  # an alias ("test") of a split already loaded shares its object
            (src, tgt), texts, manifest = load_split(d)
            display = split_prefixes(cfg).get(name, name) if name == "test" else name
            by_dir[d] = (ParallelDataset(src, tgt, *(texts or (None, None)), display), manifest)
        ds, manifest = by_dir[d]
        stats["dropped_empty"][name] = manifest["dropped"]["empty_side"]
        stats["files"][name] = [i["path"] for i in manifest["inputs"]]
        if len(ds) == 0 and name in ("train", "valid"):
            files = stats["files"][name]
            if name == "train":
                raise DataError(_no_pairs_message(files, manifest["counts"]["lines"]))
            raise DataError(
                f"the validation split is empty: {files[0]} and {files[1]} hold no sentence pair "
                f"({manifest['counts']['lines']} lines read); training validates on it, so point "
                "data.valid_prefix at a non-empty pair of files"
            )
        out[name] = ds

    max_src, max_tgt = int(cfg.max_source_positions), int(cfg.max_target_positions)
    for name, ds in list(out.items()):
        fits = (ds.src_lengths + 1 <= max_src) & (ds.tgt_lengths + 1 <= max_tgt)
        n_over = int(len(fits) - np.count_nonzero(fits))
        if name == "train":
            if n_over:
                ds = ds.subset(np.flatnonzero(fits))
                out[name] = ds
            stats["filtered_by_length"]["train"] = n_over
        else:
            stats["over_length"][name] = n_over
        stats["sizes"][name] = len(ds)

    stats["cache"] = "hit" if tok_hit and all(v == "hit" for v in split_cache.values()) else "miss"
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
    "cache_root",
    "default_splits",
    "file_digest",
    "load_translation_data",
    "preprocess_workers",
]
