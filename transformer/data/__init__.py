"""Data pipeline: corpora, SentencePiece vocabularies, binarized splits, token-bounded batches.

Typical use::

    data = load_translation_data(cfg.data)                     # tokenizers + memory-mapped splits
    train = data.splits["train"]
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens=4096,
                                arch="encoder_decoder", seed=cfg.seed)
    for epoch in range(1, n_epochs + 1):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate(train, indices, "encoder_decoder")   # -> Batch

The names below are imported on first use (PEP 562), so that a process importing one submodule
(e.g. an encoding worker of :mod:`transformer.data.binarize`) does not import torch. ``collate``
itself is imported from :mod:`transformer.data.collate`: the package attribute of that name is the
submodule once it has been imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "transformer.data.batching": ("TokenBatchSampler", "item_lengths"),
    "transformer.data.binarize": ("TokenSequences", "binarize_split", "load_split"),
    "transformer.data.collate": (
        "Batch",
        "collate_decoder_only",
        "collate_encoder_decoder",
        "make_dataloader",
        "pad_sequences",
    ),
    "transformer.data.corpus": ("available_splits", "data_root", "resolve_split_files"),
    "transformer.data.dataset": ("ParallelDataset", "TranslationData", "load_translation_data"),
    "transformer.data.download": ("ENV_DATA_DIR",),
    "transformer.data.errors": ("DataError",),
    "transformer.data.reading": ("iter_line_blocks", "iter_parallel", "read_lines", "read_parallel"),
    "transformer.data.tokenizer": ("BOS_ID", "EOS_ID", "PAD_ID", "SEP_ID", "UNK_ID", "Tokenizer"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its submodule on first access."""
    if name not in _WHERE:
        raise AttributeError(f"module 'transformer.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
