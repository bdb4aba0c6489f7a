"""Batched translation of many sentences: sort by length, batch by tokens, decode, restore order.

Used by the trainer (validation BLEU, final test), ``scripts/translate.py`` and
``scripts/evaluate.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from transformer.config import GenerationConfig, to_generation_config
from transformer.generation.common import Hypothesis, learned_positions
from transformer.generation.search import generate
from transformer.plugins import plugin_failure
from transformer.precision import decoding_precision

__all__ = [
    "batches_by_tokens",
    "detokenize",
    "make_src_tokens",
    "max_source_length",
    "translate_dataset",
    "translate_sentences",
]


def make_src_tokens(
    src_ids: Sequence[Sequence[int]],
    arch: str,
    *,
    pad_id: int = 0,
    eos_id: int = 3,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``(batch, max_len)`` right-padded source ids: ``ids + [EOS]`` for ``encoder_decoder``, ids only
    for ``decoder_only`` (the model adds the separator).

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
    """Yield sentence indices, longest first (ties by index), in batches of at most ``max_tokens``
    padded tokens, ``n_sentences * longest * rows_per_sentence``; a sentence too long alone gets a batch."""
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


def max_source_length(model: nn.Module, arch: str | None = None) -> int | None:
    """The most source ids (without specials) the model's learned positions can encode, or None when
    unbounded; an ensemble's tightest member. ``arch`` is unused."""
    members = getattr(model, "models", None)  # an ensemble: the tightest member's limit
    if members is not None:
        limits = [n for n in (max_source_length(m, arch) for m in members) if n is not None]
        return min(limits) if limits else None
    embed = getattr(model, "src_embed", None)
    rows = learned_positions(embed if embed is not None else getattr(model, "embed", None))
    return None if rows is None else rows - 1  # + EOS (encoder-decoder) or + <sep> (decoder-only)


def translate_sentences(
    model: nn.Module,
    src_ids: Sequence[Sequence[int]],
    cfg: GenerationConfig | Any,
    device: torch.device | str,
    arch: str | None = None,
    *,
    errors: dict[int, str] | None = None,
    progress: Any = False,
    desc: str = "translate",
    precision: str = "fp32",
    shard: tuple[int, int] = (0, 1),
) -> list[list[Hypothesis]]:
    """Translate many sentences, batched by source tokens, results in input order.

    Empty sources get no hypotheses, so outputs stay line-aligned with the input.

    Args:
        src_ids: source ids per sentence, without specials.
        cfg: generation settings (:func:`~transformer.config.to_generation_config`); ``max_tokens``
            bounds ``sentences * longest source * rows`` per batch (``beam_size`` or ``nbest`` rows).
        arch: defaults to ``model.arch``.
        errors: None raises on the first sentence that cannot be translated; a dict collects
            ``errors[index] = why`` and goes on (a failed batch is retried one sentence at a time). A
            plugin's exception is raised all the same.
        progress: True for a new tqdm bar on stderr, an existing bar, or False.
        precision: the run's ``train.precision`` (:func:`~transformer.precision.decoding_precision`).
        shard: ``(rank, world_size)``: decode only every ``world_size``-th batch from ``rank``.

    Returns:
        Hypotheses (best first) per sentence; empty for an empty source, an error or another shard.

    Raises:
        ValueError: a source longer than the learned positions (``errors`` None), or an unknown precision.
    """
    arch = arch or model.arch
    g = to_generation_config(cfg)
    precision = decoding_precision(precision, device)  # an unknown one is the caller's error, not a sentence's
    rows = {"beam": int(g.beam_size), "sample": int(g.nbest)}.get(g.strategy, 1)
    max_tokens = int(g.max_tokens)
    extra = 1 if arch == "encoder_decoder" else 0
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    limit = max_source_length(model, arch)
    todo = []
    for i, s in enumerate(src_ids):
        if not len(s):
            continue
        if limit is not None and len(s) > limit:
            msg = (
                f"the source has {len(s)} tokens, more than the {limit} the model can read "
                "(its learned positions, model.max_positions)"
            )
            if errors is None:
                raise ValueError(f"sentence {i}: {msg}")
            errors[i] = msg
            continue
        todo.append(i)
    bar = None if progress is False or progress is None else progress  # (a tqdm's truth value is its total)
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=len(src_ids), desc=desc, unit="sent", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
    if bar is not None:
        bar.update(len(src_ids) - len(todo))

    def decode(idx: list[int]) -> None:
        src = make_src_tokens([src_ids[i] for i in idx], arch, pad_id=model.pad_id, eos_id=model.eos_id, device=device)
        for i, hyps in zip(idx, generate(model, src, g, precision)):
            results[i] = hyps
            if not hyps and errors is not None:  # see NonFiniteOutputWarning
                errors[i] = "the model's output is not finite (NaN/inf): a diverged model?"

    try:
        rank, world = shard
        for k, batch in enumerate(batches_by_tokens([len(src_ids[i]) + extra for i in todo], max_tokens, rows)):
            idx = [todo[j] for j in batch]
            if k % world != rank:  # another rank's batch
                if bar is not None:
                    bar.update(len(idx))
                continue
            try:
                decode(idx)
            except Exception as e:  # noqa: BLE001 - reported per sentence below
                if errors is None or plugin_failure(e) is not None:  # a plugin's bug is the command's error
                    raise
                for i in idx if len(idx) > 1 else ():
                    try:
                        decode([i])
                    except Exception as e1:  # noqa: BLE001
                        if plugin_failure(e1) is not None:
                            raise
                        errors[i] = f"{type(e1).__name__}: {e1}"
                if len(idx) == 1:
                    errors[idx[0]] = f"{type(e).__name__}: {e}"
            if bar is not None:
                bar.update(len(idx))
    finally:
        if progress is True:
            bar.close()
    return results


def detokenize(hyps: Sequence[Sequence[Hypothesis]] | Sequence[Hypothesis], tokenizer: Any) -> list[str]:
    """Text of the best hypothesis of each sentence (or of each hypothesis of a flat list); ``""`` for none."""
    out = []
    for h in hyps:
        best = h if isinstance(h, Hypothesis) else (h[0] if h else None)
        out.append(tokenizer.decode(best.tokens) if best is not None else "")
    return out


def translate_dataset(
    model: nn.Module,
    dataset: Any,
    tokenizer: Any,
    cfg: GenerationConfig | Any,
    device: torch.device | str,
    *,
    errors: dict[int, str] | None = None,
    progress: Any = False,
    desc: str = "translate",
    precision: str = "fp32",
    shard: tuple[int, int] = (0, 1),
) -> list[str]:
    """Detokenised best hypotheses of a dataset's ``src``, in dataset order (:func:`translate_sentences`'s
    keywords; a failed sentence, or one of another shard, gives ``""``)."""
    hyps = translate_sentences(
        model,
        dataset.src,
        cfg,
        device,
        model.arch,
        errors=errors,
        progress=progress,
        desc=desc,
        precision=precision,
        shard=shard,
    )
    return detokenize(hyps, tokenizer)
