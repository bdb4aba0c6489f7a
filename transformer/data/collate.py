"""Lists of id lists -> padded tensors for the two architectures, all right-padded with ``PAD``.

Encoder-decoder (Vaswani et al. 2017), teacher forcing::

    src_tokens          = src + [EOS]            (B, S)
    prev_output_tokens  = [BOS] + tgt            (B, T)
    target              = tgt + [EOS]            (B, T)

Decoder-only prefix LM (Wang et al. 2021; Raffel et al. 2020), no loss on the source::

    tokens = src + [SEP] + tgt                   (B, L),  L = len(src) + 1 + len(tgt)
    target = [PAD] * len(src) + tgt + [EOS]      (B, L)

A batch's tensors are views of one host buffer filled by numpy, with no Python loop per sentence."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.utils.data

from transformer.data.binarize import TokenSequences
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID

if TYPE_CHECKING:
    from transformer.data.batching import TokenBatchSampler
    from transformer.data.dataset import ParallelDataset


@dataclass
class Batch:
    """One collated batch.

    Attributes:
        net_input: ``{"src_tokens": (B, S), "prev_output_tokens": (B, T)}`` or ``{"tokens": (B, L)}``.
        target: ``(B, T)`` or ``(B, L)``, ``PAD`` where no loss is taken; ``(B, 0)`` without a target.
        src_tokens: ``(B, S)`` source for generation (encoder-decoder: with EOS; decoder-only: ids only).
        ids: ``(B,)`` dataset indices of the rows.
        ntokens: non-pad target tokens (the loss normaliser).
        nsentences: ``B``.
    """

    net_input: dict[str, torch.Tensor]
    target: torch.Tensor
    src_tokens: torch.Tensor
    ids: torch.Tensor
    ntokens: int
    nsentences: int

    @property
    def loss_mask(self) -> torch.Tensor:
        """``(B, T)`` / ``(B, L)`` bool, true where a loss is taken (``target != PAD``)."""
        return self.target.ne(PAD_ID)

    def to(self, device: torch.device | str, non_blocking: bool = False, *, training_only: bool = False) -> Batch:
        """A new :class:`Batch` on ``device``; ``training_only`` moves ``net_input`` and ``target`` only."""
        mv = functools.partial(torch.Tensor.to, device=device, non_blocking=non_blocking)
        keep = (lambda t: t) if training_only else mv
        return Batch(
            net_input={k: mv(v) for k, v in self.net_input.items()},
            target=mv(self.target),
            src_tokens=keep(self.src_tokens),
            ids=keep(self.ids),
            ntokens=self.ntokens,
            nsentences=self.nsentences,
        )

    def pin_memory(self, training_only: bool = False) -> Batch:
        """A new :class:`Batch` in page-locked memory, so a ``non_blocking`` copy does not wait;
        ``training_only`` pins ``net_input`` and ``target`` only."""
        keep = (lambda t: t) if training_only else torch.Tensor.pin_memory
        return Batch(
            net_input={k: v.pin_memory() for k, v in self.net_input.items()},
            target=self.target.pin_memory(),
            src_tokens=keep(self.src_tokens),
            ids=keep(self.ids),
            ntokens=self.ntokens,
            nsentences=self.nsentences,
        )


def _as_sequences(seqs: Sequence[Sequence[int]]) -> TokenSequences:
    """``seqs`` as a :class:`~transformer.data.binarize.TokenSequences` (itself, or flattened once)."""
    return seqs if isinstance(seqs, TokenSequences) else TokenSequences.from_lists(seqs)


def _width(lengths: np.ndarray, multiple: int) -> int:
    """The longest of ``lengths`` rounded up to ``multiple`` (0 for no rows)."""
    width = int(lengths.max()) if len(lengths) else 0
    return -(-width // multiple) * multiple


_ALIGN = 8
"""Elements of int64 in 64 bytes: each of a batch's tensors starts on such a boundary of its buffer."""


def _one_buffer(n: int, widths: Sequence[int]) -> list[torch.Tensor]:
    """``(n, width)`` long tensors, one per width, laid one after the other in one new buffer, each
    on a 64-byte boundary (``torch.compile``'s code copies a misaligned input first)."""
    spans = [-(-n * width // _ALIGN) * _ALIGN for width in widths]
    buffer = torch.empty(sum(spans), dtype=torch.long)
    starts = np.cumsum([0, *spans[:-1]])
    return [buffer[start : start + n * width].view(n, width) for start, width in zip(starts.tolist(), widths)]


def pad_sequences(seqs: Sequence[Sequence[int]], pad: int = PAD_ID, multiple: int = 1) -> torch.Tensor:
    """``(B, width)`` long: ``B`` id lists right-padded, ``width`` the longest rounded up to ``multiple``."""
    seqs = _as_sequences(seqs)
    out = torch.full((len(seqs), _width(seqs.lengths, multiple)), pad, dtype=torch.long)
    seqs.write_rows(out.numpy())
    return out


def _ids_tensor(ids: Any, n: int) -> torch.Tensor:
    if ids is None:
        return torch.arange(n, dtype=torch.long)
    t = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if t.numel() != n:
        raise ValueError(f"{t.numel()} ids for {n} examples")
    return t


def collate_encoder_decoder(
    src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]] | None, ids: Any = None, pad_to_multiple: int = 1
) -> Batch:
    """Collate ``B`` source and target id lists (no specials) for an encoder-decoder (module docstring).

    ``tgt=None`` gives a generation-only batch (``(B, 0)`` decoder tensors, ``ntokens`` 0); ``ids``
    defaults to ``0..B-1``; widths are rounded up to ``pad_to_multiple``.

    Raises:
        ValueError: ``src`` and ``tgt`` (or ``ids``) differ in length.
    """
    src = _as_sequences(src)
    n, m = len(src), pad_to_multiple
    if tgt is not None and len(tgt) != n:
        raise ValueError(f"{n} sources but {len(tgt)} targets")
    rows = np.arange(n)
    src_len = src.lengths
    width_s = _width(src_len + 1, m)
    if tgt is None:
        (src_tokens,) = _one_buffer(n, [width_s])
        prev = torch.empty((n, 0), dtype=torch.long)
        target = torch.empty((n, 0), dtype=torch.long)
        ntokens = 0
    else:
        tgt = _as_sequences(tgt)
        tgt_len = tgt.lengths
        width_t = _width(tgt_len + 1, m)
        src_tokens, prev, target = _one_buffer(n, [width_s, width_t, width_t])
        p, y = prev.numpy(), target.numpy()
        p.fill(PAD_ID)
        p[:, :1] = BOS_ID  # (B, T): BOS + tgt (a slice: a batch of no rows has no column)
        tgt.write_rows(p, columns=1)
        y[:, :-1] = p[:, 1:]  # (B, T): tgt + EOS, the decoder input shifted left
        y[:, -1:] = PAD_ID
        y[rows, tgt_len] = EOS_ID
        ntokens = int(tgt_len.sum()) + n
    s = src_tokens.numpy()
    s.fill(PAD_ID)
    src.write_rows(s)
    s[rows, src_len] = EOS_ID
    return Batch(
        net_input={"src_tokens": src_tokens, "prev_output_tokens": prev},
        target=target,
        src_tokens=src_tokens,
        ids=_ids_tensor(ids, n),
        ntokens=ntokens,
        nsentences=n,
    )


def collate_decoder_only(
    src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]] | None, ids: Any = None, pad_to_multiple: int = 1
) -> Batch:
    """Collate ``B`` source and target id lists for a decoder-only prefix LM (module docstring).

    ``tgt=None`` gives the prompt ``src + [SEP]`` and a ``(B, 0)`` target.

    Raises:
        ValueError: ``src`` and ``tgt`` (or ``ids``) differ in length.
    """
    src = _as_sequences(src)
    n, m = len(src), pad_to_multiple
    if tgt is not None and len(tgt) != n:
        raise ValueError(f"{n} sources but {len(tgt)} targets")
    rows = np.arange(n)
    src_len = src.lengths
    width_s = _width(src_len, m)
    if tgt is None:
        width = _width(src_len + 1, m)
        tokens, src_tokens = _one_buffer(n, [width, width_s])
        target = torch.empty((n, 0), dtype=torch.long)
        ntokens = 0
    else:
        tgt = _as_sequences(tgt)
        tgt_len = tgt.lengths
        width = _width(src_len + 1 + tgt_len, m)
        tokens, target, src_tokens = _one_buffer(n, [width, width, width_s])
        ntokens = int(tgt_len.sum()) + n
    col = np.arange(width)
    x = tokens.numpy()
    x.fill(PAD_ID)
    src.write_rows(x)  # (B, L): src + SEP (+ tgt)
    x[rows, src_len] = SEP_ID
    if tgt is not None:
        tgt.write_rows(x, columns=src_len + 1)
        # (B, L): tokens shifted left (SEP predicts tgt[0]), PAD over the source, EOS after tgt
        y = target.numpy()
        y[:, :-1] = x[:, 1:]
        y[:, -1:] = PAD_ID
        np.copyto(y, PAD_ID, where=col < src_len[:, None])
        y[rows, src_len + tgt_len] = EOS_ID
    # (B, S): the source alone, the start of tokens with SEP and tgt padded out (S <= L)
    s = src_tokens.numpy()
    s[:] = x[:, :width_s]
    np.copyto(s, PAD_ID, where=col[:width_s] >= src_len[:, None])
    return Batch(
        net_input={"tokens": tokens},
        target=target,
        src_tokens=src_tokens,
        ids=_ids_tensor(ids, n),
        ntokens=ntokens,
        nsentences=n,
    )


def _pick(seqs: Sequence[Sequence[int]], indices: np.ndarray) -> Sequence[Sequence[int]]:
    """The sequences ``indices`` of ``seqs``: a view of a ``TokenSequences``, a list otherwise."""
    if isinstance(seqs, TokenSequences):
        return seqs.subset(indices)
    return [seqs[i] for i in indices.tolist()]


def collate(
    dataset: ParallelDataset, indices: Sequence[int], arch: str, *, with_target: bool = True, pad_to_multiple: int = 1
) -> Batch:
    """Collate ``indices`` of ``dataset`` for ``arch`` (``encoder_decoder`` | ``decoder_only``).

    Raises:
        ValueError: unknown ``arch``.
    """
    if arch not in ("encoder_decoder", "decoder_only"):
        raise ValueError(f"arch={arch!r} is not one of encoder_decoder, decoder_only")
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    src = _pick(dataset.src, idx)
    tgt = _pick(dataset.tgt, idx) if with_target else None
    fn = collate_encoder_decoder if arch == "encoder_decoder" else collate_decoder_only
    return fn(src, tgt, idx, pad_to_multiple)


class _IndexDataset(torch.utils.data.Dataset):
    """Map-style dataset returning its index, so that ``collate_fn`` sees index lists."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _collate_indices(dataset: ParallelDataset, arch: str, with_target: bool, indices: list[int]) -> Batch:
    return collate(dataset, indices, arch, with_target=with_target)


def make_dataloader(
    dataset: ParallelDataset,
    sampler: TokenBatchSampler,
    arch: str,
    *,
    num_workers: int = 0,
    pin_memory: bool = False,
    with_target: bool = True,
) -> torch.utils.data.DataLoader:
    """A DataLoader yielding :class:`Batch` objects in the sampler's order."""
    return torch.utils.data.DataLoader(
        _IndexDataset(len(dataset)),
        batch_sampler=sampler,
        collate_fn=functools.partial(_collate_indices, dataset, arch, with_target),
        num_workers=num_workers,
        pin_memory=pin_memory,
    )


__all__ = [
    "Batch",
    "collate",
    "collate_decoder_only",
    "collate_encoder_decoder",
    "make_dataloader",
    "pad_sequences",
]
