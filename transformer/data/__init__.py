"""Data pipeline: corpora, SentencePiece vocabularies, token-bounded batches, collation.

Typical use::

    data = load_translation_data(cfg.data)                     # tokenizers + encoded splits
    train = data.splits["train"]
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens=4096,
                                arch="encoder_decoder", seed=cfg.seed)
    for epoch in range(1, n_epochs + 1):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate(train, indices, "encoder_decoder")   # -> Batch
"""

from transformer.data.batching import TokenBatchSampler, item_lengths
from transformer.data.collate import (
    Batch,
    collate,
    collate_decoder_only,
    collate_encoder_decoder,
    make_dataloader,
    pad_sequences,
)
from transformer.data.corpus import (
    ENV_DATA_DIR,
    DataError,
    available_splits,
    data_root,
    read_lines,
    read_parallel,
    resolve_split_files,
)
from transformer.data.dataset import ParallelDataset, TranslationData, load_translation_data
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID, UNK_ID, Tokenizer

__all__ = [
    "BOS_ID",
    "ENV_DATA_DIR",
    "EOS_ID",
    "PAD_ID",
    "SEP_ID",
    "UNK_ID",
    "Batch",
    "DataError",
    "ParallelDataset",
    "Tokenizer",
    "TokenBatchSampler",
    "TranslationData",
    "available_splits",
    "collate",
    "collate_decoder_only",
    "collate_encoder_decoder",
    "data_root",
    "item_lengths",
    "load_translation_data",
    "make_dataloader",
    "pad_sequences",
    "read_lines",
    "read_parallel",
    "resolve_split_files",
]
