"""Load a translation corpus: files -> SentencePiece model(s) -> binarized, memory-mapped splits.

:func:`load_translation_data` resolves (and for Multi30k downloads) the files, trains or loads the
SentencePiece model(s), binarizes or finds every split in the cache, maps it read-only, and filters
the training pairs by length. The cache is the binarized data; ``data.binarized=<folder>`` reads
such a folder directly. docs/switches.md#the-data-pipeline."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from transformer.data.binarize import TokenSequences, load_split
from transformer.data.cache import build, find_binarized, load_tokenizers, no_pairs_message
from transformer.data.corpus import split_prefixes
from transformer.data.errors import DataError
from transformer.data.tokenizer import Tokenizer


@dataclass
class ParallelDataset:
    """One split of a parallel corpus.

    Attributes:
        src, tgt: ids per example without specials (a :class:`~transformer.data.binarize.TokenSequences`
            over memory maps, or any sequence of id lists).
        src_text, tgt_text: the original lines (``tgt_text``: the BLEU references); None for training.
        name: ``train``, ``valid``, ``test_2016_flickr``, ...
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

    def subset(self, indices: Sequence[int] | np.ndarray, name: str | None = None) -> ParallelDataset:
        """A new dataset of the examples ``indices`` (in that order), sharing the token arrays."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)

        def pick(seqs: Any) -> Any:
            if seqs is None:
                return None
            if isinstance(seqs, TokenSequences):
                return seqs.subset(idx)
            return [seqs[i] for i in idx.tolist()]

        return ParallelDataset(
            pick(self.src),
            pick(self.tgt),
            pick(self.src_text),
            pick(self.tgt_text),
            self.name if name is None else name,
        )


@dataclass
class TranslationData:
    """Everything a run needs from the data side.

    Attributes:
        tgt_tokenizer: the same object as ``src_tokenizer`` when joint.
        splits: ``train``, ``valid``, each test split by name, and ``test`` (an alias of the
            ``data.test_prefix`` split), as requested.
        stats: ``dropped_empty``, ``filtered_by_length``, ``over_length`` (kept valid/test pairs over
            the position limits), ``sizes``, ``files``, ``cache`` / ``tokenizer_cache`` /
            ``split_cache`` (hit or miss), ``cache_dir``, ``split_dirs``, ``seconds``, ``vocab_size``.
    """

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    splits: dict[str, ParallelDataset]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def joint_vocab(self) -> bool:
        """Whether source and target share one tokenizer."""
        return self.src_tokenizer is self.tgt_tokenizer


# ----------------------------------------------------------------------------- entry point


def default_splits(cfg: Any) -> list[str]:
    """Splits loaded when none are requested: train, valid, test (if set) and every test split."""
    return list(split_prefixes(cfg))


_DIGESTS: dict[tuple[str, int, int], str] = {}


def load_translation_data(
    cfg: Any,
    splits: Sequence[str] | None = None,
    log: Callable[[str], None] | None = print,
) -> TranslationData:
    """Load (building or reading the cache) the tokenizers and binarized splits of a corpus.

    Args:
        cfg: a :class:`~transformer.config.DataConfig`.
        splits: split names; None loads :func:`default_splits`. The training files are read for the
            vocabulary (unless ``data.binarized``), but the train split is returned only when asked.
        log: called with a few progress lines; None for silence.

    Returns:
        A :class:`TranslationData`. Training pairs with ``len(src) + 1 > max_source_positions`` or
        ``len(tgt) + 1 > max_target_positions`` are removed; other splits keep every pair.

    Raises:
        DataError: an unknown or missing split (the available ones listed), missing files that cannot
            be downloaded, invalid UTF-8, parallel files of different lengths, no training pair or an
            empty validation split, or a ``data.binarized`` folder built with other options.
        ValueError: invalid SentencePiece options.
    """
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    names = list(dict.fromkeys(splits if splits is not None else default_splits(cfg)))
    if getattr(cfg, "binarized", None):
        folder = Path(str(cfg.binarized)).expanduser()
        split_dirs, split_cache, tok_hit = find_binarized(cfg, folder, names), {n: "hit" for n in names}, True
    else:
        folder, split_dirs, split_cache, tok_hit = build(cfg, names, say)
    return _assemble(cfg, folder, split_dirs, split_cache, tok_hit, say, t0)


def _assemble(
    cfg: Any,
    folder: Path,
    split_dirs: dict[str, Path],
    split_cache: dict[str, str],
    tok_hit: bool,
    say: Callable[[str], None],
    t0: float,
) -> TranslationData:
    """Map the split folders, apply the training length filter, count, and log one line."""
    src_tok, tgt_tok = load_tokenizers(folder, bool(cfg.joint_vocab))
    stats: dict[str, Any] = {
        "cache_dir": str(folder),
        "split_dirs": {n: str(d) for n, d in split_dirs.items()},
        "split_cache": split_cache,
        "tokenizer_cache": "hit" if tok_hit else "miss",
        "dropped_empty": {},
        "filtered_by_length": {},
        "over_length": {},
        "sizes": {},
        "files": {},
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
                raise DataError(no_pairs_message(files, manifest["counts"]["lines"]))
            raise DataError(
                f"the validation split is empty: {files[0]} and {files[1]} hold no sentence pair "
                f"({manifest['counts']['lines']} lines read); training validates on it, so point "
                "data.valid_prefix at a non-empty pair of files"
            )
        out[name] = ds

    max_src, max_tgt = int(cfg.max_source_positions), int(cfg.max_target_positions)
    train_max = getattr(cfg, "train_max_target_tokens", None)
    for name, ds in list(out.items()):
        fits = (ds.src_lengths + 1 <= max_src) & (ds.tgt_lengths + 1 <= max_tgt)
        n_over = int(len(fits) - np.count_nonzero(fits))
        if name == "train" and train_max is not None:  # the study's training length L (targets only)
            short = ds.tgt_lengths <= int(train_max)
            stats["filtered_by_train_max_target_tokens"] = int(np.count_nonzero(fits & ~short))
            fits &= short
            n_over = int(len(fits) - np.count_nonzero(fits))
            if not fits.any():
                raise DataError(
                    f"data.train_max_target_tokens={train_max} removes every training pair of "
                    f"{stats['files']['train'][1]} (targets are longer); raise it or set it to null"
                )
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
            if "filtered_by_train_max_target_tokens" in stats:
                extra[-1] += (
                    f", of which {stats['filtered_by_train_max_target_tokens']} with targets over "
                    f"data.train_max_target_tokens={train_max}"
                )
        if stats["over_length"].get(name):
            extra.append(f"{stats['over_length'][name]} over length kept")
        parts.append(f"{name} {len(ds)}" + (f" ({', '.join(extra)})" if extra else ""))
    vocab = f"{len(src_tok)} joint" if src_tok is tgt_tok else f"{len(src_tok)}/{len(tgt_tok)}"
    say(
        f"[data] {cfg.name}: {'; '.join(parts)}; vocab {vocab}; cache {stats['cache']} "
        f"({folder}) in {stats['seconds']:.2f}s"
    )
    return TranslationData(src_tokenizer=src_tok, tgt_tokenizer=tgt_tok, splits=out, stats=stats)


__all__ = ["ParallelDataset", "TranslationData", "default_splits", "load_translation_data"]
