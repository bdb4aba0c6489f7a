"""Multi30k-like training batches for the ``realistic`` section of the GPU check: one batch per
``max_tokens`` as the project's own batching (:class:`~transformer.data.batching.TokenBatchSampler`,
lengths rounded to a multiple of 8) packs Multi30k's training pairs, with their real lengths (pieces
of the run's SentencePiece vocabulary) and random ids; and the training FLOPs of such a batch counted
over its real tokens only (no padding)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from transformer.data.batching import TokenBatchSampler
from transformer.data.collate import collate_decoder_only, collate_encoder_decoder
from transformer.data.tokenizer import PAD_ID
from transformer.models.flops import forward_flops

MULTIPLE = 8  # lengths padded to a multiple of 8 (fairseq's --pad-to-multiple; tensor-core friendly)


@dataclasses.dataclass
class LengthBatch:
    """One batch's real lengths: ``src`` and ``tgt`` in pieces, without specials, one per row."""

    max_tokens: int
    src: np.ndarray
    tgt: np.ndarray
    batches_in_epoch: int  # how many batches the sampler made of the whole training split

    @property
    def rows(self) -> int:
        """Sentence pairs in the batch."""
        return len(self.src)

    @property
    def target_tokens(self) -> int:
        """Real target tokens: the target pieces and one EOS per row (what the loss is over)."""
        return int(self.tgt.sum()) + self.rows


def representative_batch(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, arch: str) -> LengthBatch:
    """The median batch of an epoch of the project's batching at ``max_tokens``: batches are ordered
    by their (rounded) length and the middle one among the full ones (``rows == max_tokens // length``:
    not a bucket's smaller last batch) is taken, so the batch has a typical length, not the shortest
    or the longest.

    Raises:
        ValueError: ``max_tokens`` is smaller than the longest pair (from the sampler), or no pairs.
    """
    if len(src_lengths) == 0:
        raise ValueError("no training pairs to take lengths from")
    sampler = TokenBatchSampler(
        src_lengths, tgt_lengths, max_tokens, arch=arch, shuffle=False, bucket_multiple=MULTIPLE
    )
    batches = sampler.global_batches()
    item = sampler.padded_lengths(sampler.lengths)
    longest = [int(item[b].max()) for b in batches]
    full = [i for i, b in enumerate(batches) if len(b) == max_tokens // longest[i]] or list(range(len(batches)))
    full.sort(key=lambda i: (longest[i], i))
    pick = batches[full[len(full) // 2]]
    return LengthBatch(max_tokens, np.asarray(src_lengths)[pick], np.asarray(tgt_lengths)[pick], len(batches))


def make_tensors(lb: LengthBatch, arch: str, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The batch as ``train_step``'s models take it, ids uniform in ``5..vocab-1``, collated by the
    project (:func:`~transformer.data.collate.collate_encoder_decoder` / ``collate_decoder_only``,
    padded to a multiple of 8): encoder-decoder ``src``, ``prev``, ``target``; decoder-only ``tokens``
    (source + SEP + target) and ``target`` (PAD over the source, then the target + EOS)."""
    g = torch.Generator().manual_seed(seed)
    src = [torch.randint(5, vocab, (int(n),), generator=g).tolist() for n in lb.src]
    tgt = [torch.randint(5, vocab, (int(n),), generator=g).tolist() for n in lb.tgt]
    if arch == "encoder_decoder":
        b = collate_encoder_decoder(src, tgt, pad_to_multiple=MULTIPLE)
        return {"src": b.net_input["src_tokens"], "prev": b.net_input["prev_output_tokens"], "target": b.target}
    b = collate_decoder_only(src, tgt, pad_to_multiple=MULTIPLE)
    return {"tokens": b.net_input["tokens"], "target": b.target}


def real_train_flops(cfg: Any, src: np.ndarray, tgt: np.ndarray, vocab: int) -> float:
    """Training FLOPs of a batch over its real tokens (``src`` and ``tgt``: each row's lengths without
    specials): 3 x the forward FLOPs of every row at its own lengths
    (:func:`~transformer.models.flops.forward_flops`), the output layer at the loss positions only
    (the decoder-only model's source positions carry no loss)."""
    total = 0.0
    pairs, counts = np.unique(np.stack([src, tgt], 1), axis=0, return_counts=True)
    for (s, t), n in zip(pairs.tolist(), counts.tolist()):
        if cfg.arch == "encoder_decoder":
            f = forward_flops(cfg, vocab, s + 1, t + 1)["total"]
        else:  # s + 1 + t positions; the loss (and the fused output layer) over the last t + 1
            f = forward_flops(cfg, vocab, s, t)["total"] - 2 * s * cfg.d_model * vocab
        total += 3 * f * n
    return total


def describe(lb: LengthBatch, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The batch as a row shows it: rows x padded lengths (``dims``), real target tokens and the share
    of padding (of the target for an encoder-decoder, of the whole sequence for a decoder-only model);
    under ``batch``: the padded shapes, the mean lengths, the batches of the epoch."""
    main, shape = tensors.get("tokens", tensors["target"]), {k: list(v.shape) for k, v in tensors.items()}
    dims = (
        f"{lb.rows} x {shape['src'][1]} x {shape['target'][1]}"
        if "src" in shape
        else f"{lb.rows} x {shape['tokens'][1]} (one sequence)"
    )
    batch = {
        "rows": lb.rows,
        "shape": shape,
        "mean_src_len": float(lb.src.mean()),
        "mean_tgt_len": float(lb.tgt.mean()),
    }
    batch["batches_in_epoch"] = lb.batches_in_epoch
    padding = 1 - int(main.ne(PAD_ID).sum()) / main.numel()
    return {"dims": dims, "target_tokens": lb.target_tokens, "padding": padding, "batch": batch}
