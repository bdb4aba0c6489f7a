"""Batched translation of many sentences: sort by length, batch by tokens, decode, restore order.

Used by the trainer (validation BLEU, final test), ``scripts/translate.py`` and
``scripts/evaluate.py``.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch
from torch import nn

from transformer.generation.search import Hypothesis, _cfg, generate

__all__ = ["batches_by_tokens", "detokenize", "make_src_tokens", "translate_dataset", "translate_sentences"]


def make_src_tokens(
    src_ids: Sequence[Sequence[int]], arch: str, *, pad_id: int = 0, eos_id: int = 3,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Build the right-padded source batch in the format of ``arch``.

    Args:
        src_ids: source ids per sentence, without specials.
        arch: ``encoder_decoder`` (ids + [EOS]) or ``decoder_only`` (ids only; the model appends
            the separator itself as the first decoder input).
        pad_id, eos_id: special ids.
        device: where the tensor goes.

    Returns:
        ``(batch, max_len)`` long tensor.

    Raises:
        ValueError: unknown ``arch``.
    """
    if arch == "encoder_decoder":
        seqs = [list(s) + [eos_id] for s in src_ids]
    elif arch == "decoder_only":
        seqs = [list(s) for s in src_ids]
    else:
        raise ValueError(f"arch={arch!r} is not one of encoder_decoder, decoder_only")
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


def batches_by_tokens(lengths: Sequence[int], max_tokens: int, rows_per_sentence: int = 1) -> Iterator[list[int]]:
    """Group sentence indices, longest first, into batches of at most ``max_tokens`` padded tokens.

    A batch costs ``n_sentences * longest * rows_per_sentence`` tokens (e.g. beams per sentence);
    a sentence too long for ``max_tokens`` on its own still gets a batch of one.

    Args:
        lengths: source length of each sentence (in the model's format).
        max_tokens: budget per batch.
        rows_per_sentence: decoder rows per sentence (beam size, samples).

    Yields:
        Lists of indices into ``lengths`` (sorted by decreasing length, ties by index).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batch: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i], 1)
        if batch and (len(batch) + 1) * width * rows_per_sentence > max_tokens:
            yield batch
            batch, width = [], max(lengths[i], 1)
        batch.append(i)
        longest = width
    if batch:
        yield batch


def translate_sentences(
    model: nn.Module,
    src_ids: Sequence[Sequence[int]],
    cfg: Any,
    device: torch.device | str,
    arch: str | None = None,
) -> list[list[Hypothesis]]:
    """Translate many sentences, batched by source tokens, results in input order.

    Args:
        model: an encoder-decoder or decoder-only model (already on ``device``).
        src_ids: source ids per sentence, without specials.
        cfg: a :class:`~transformer.config.GenerationConfig` (or an object/dict with its fields);
            ``max_tokens`` bounds ``sentences * longest source * rows per sentence`` per batch, with
            ``beam_size`` rows per sentence for beam search and ``nbest`` for sampling.
        device: device of the model.
        arch: ``encoder_decoder`` or ``decoder_only``; defaults to ``model.arch``.

    Returns:
        One list of hypotheses (best first) per input sentence, in input order.
    """
    arch = arch or model.arch
    strategy = _cfg(cfg, "strategy", "beam")
    rows = {"beam": int(_cfg(cfg, "beam_size", 5)), "sample": int(_cfg(cfg, "nbest", 1))}.get(strategy, 1)
    max_tokens = int(_cfg(cfg, "max_tokens", 8000))
    extra = 1 if arch == "encoder_decoder" else 0
    lengths = [len(s) + extra for s in src_ids]
    results: list[list[Hypothesis] | None] = [None] * len(src_ids)
    for idx in batches_by_tokens(lengths, max_tokens, rows):
        src = make_src_tokens([src_ids[i] for i in idx], arch, pad_id=model.pad_id, eos_id=model.eos_id, device=device)
        for i, hyps in zip(idx, generate(model, src, cfg)):
            results[i] = hyps
    return results  # type: ignore[return-value]


def detokenize(hyps: Sequence[Sequence[Hypothesis]] | Sequence[Hypothesis], tokenizer: Any) -> list[str]:
    """Text of the best hypothesis of each sentence (or of each hypothesis of a flat list).

    Args:
        hyps: output of :func:`translate_sentences` (lists, best first), or plain hypotheses.
        tokenizer: anything with ``decode(ids) -> str`` that stops at EOS
            (:class:`~transformer.data.Tokenizer`).

    Returns:
        One string per item.
    """
    out = []
    for h in hyps:
        best = h if isinstance(h, Hypothesis) else h[0]
        out.append(tokenizer.decode(best.tokens))
    return out


def translate_dataset(model: nn.Module, dataset: Any, tokenizer: Any, cfg: Any, device: torch.device | str) -> list[str]:
    """Translate a :class:`~transformer.data.ParallelDataset` and detokenise the best hypotheses.

    Args:
        model: the model, on ``device``.
        dataset: anything with ``src`` (source ids per example, no specials).
        tokenizer: the target tokenizer (``decode``).
        cfg: generation settings (see :func:`translate_sentences`).
        device: device of the model.

    Returns:
        Detokenised best hypotheses, in dataset order (compare with ``dataset.tgt_text``).
    """
    return detokenize(translate_sentences(model, dataset.src, cfg, device, model.arch), tokenizer)
