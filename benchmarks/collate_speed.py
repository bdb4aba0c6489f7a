"""Host time to collate one batch, the list-based collation beside the numpy one: what
``python -m benchmarks.data_pipeline --collate MAX_TOKENS ...`` reports.

:func:`list_collate` is :func:`transformer.data.collate.collate` as it was before it read the token
arrays with numpy: every sentence turned into a Python list, padded, then one ``torch.tensor`` call
per tensor. :func:`collate_times` times both on the same batches of a sampler's epoch, interleaved
round by round (a shared machine's speed drifts), and checks that they give the same tensors.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from transformer.data.collate import Batch, collate
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID


def _pad(seqs: Sequence[Sequence[int]], pad: int = PAD_ID, multiple: int = 1) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0)
    width = -(-width // multiple) * multiple
    rows = [list(s) + [pad] * (width - len(s)) for s in seqs]
    return torch.tensor(rows, dtype=torch.long).reshape(len(seqs), width)


def list_collate(dataset: Any, indices: Sequence[int], arch: str, pad_to_multiple: int = 1) -> Batch:
    """The list-based collation of a training batch (with its target), as it was."""
    src = [dataset.src[i] for i in indices]
    tgt = [dataset.tgt[i] for i in indices]
    n, m = len(src), pad_to_multiple
    ids = torch.as_tensor(list(indices), dtype=torch.long).reshape(-1)
    ntokens = sum(len(t) + 1 for t in tgt)
    if arch == "encoder_decoder":
        src_tokens = _pad([list(s) + [EOS_ID] for s in src], multiple=m)
        prev = _pad([[BOS_ID] + list(t) for t in tgt], multiple=m)
        target = _pad([list(t) + [EOS_ID] for t in tgt], multiple=m)
        net_input = {"src_tokens": src_tokens, "prev_output_tokens": prev}
    else:
        src_tokens = _pad([list(s) for s in src], multiple=m)
        tokens = _pad([list(s) + [SEP_ID] + list(t) for s, t in zip(src, tgt)], multiple=m)
        target = _pad([[PAD_ID] * len(s) + list(t) + [EOS_ID] for s, t in zip(src, tgt)], multiple=m)
        net_input = {"tokens": tokens}
    return Batch(net_input, target, src_tokens, ids, ntokens, n)


def _equal(a: Batch, b: Batch) -> bool:
    tensors = [(a.net_input[k], b.net_input.get(k)) for k in a.net_input]
    tensors += [(a.target, b.target), (a.src_tokens, b.src_tokens), (a.ids, b.ids)]
    same = all(y is not None and torch.equal(x, y) for x, y in tensors)
    return same and a.net_input.keys() == b.net_input.keys() and (a.ntokens, a.nsentences) == (b.ntokens, b.nsentences)


def collate_times(train: Any, max_tokens: int, arch: str, rounds: int = 5, max_batches: int = 64) -> dict[str, Any]:
    """Milliseconds per batch of the list-based and the numpy collation of ``train``.

    Args:
        train: a :class:`~transformer.data.dataset.ParallelDataset` (the training split).
        max_tokens: the :class:`~transformer.data.batching.TokenBatchSampler`'s token bound.
        arch: ``encoder_decoder`` or ``decoder_only``.
        rounds: timed rounds, each over the same batches, the two paths interleaved.
        max_batches: the first batches of the epoch that are timed.

    Returns:
        ``list_ms`` and ``numpy_ms`` (the median round's mean per batch), ``ratio``, ``rows`` and
        ``target_tokens`` (means per batch), ``batches``.

    Raises:
        AssertionError: the two paths give different batches.
    """
    from transformer.data.batching import TokenBatchSampler

    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens, arch=arch, seed=1)
    sampler.set_epoch(1)
    batches = [b for _, b in zip(range(max_batches), sampler)]
    paths = {"list": lambda b: list_collate(train, b, arch), "numpy": lambda b: collate(train, b, arch)}
    for b in batches:  # every token page read once, and the paths agree
        assert _equal(paths["list"](b), paths["numpy"](b)), "the list-based and numpy batches differ"
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            t = time.perf_counter()
            for b in batches:
                fn(b)
            times[name].append((time.perf_counter() - t) * 1000 / len(batches))
    list_ms, numpy_ms = statistics.median(times["list"]), statistics.median(times["numpy"])
    return {
        "arch": arch,
        "max_tokens": max_tokens,
        "batches": len(batches),
        "rows": sum(len(b) for b in batches) / len(batches),
        "target_tokens": sum(int(train.tgt_lengths[b].sum()) + len(b) for b in batches) / len(batches),
        "list_ms": list_ms,
        "numpy_ms": numpy_ms,
        "ratio": list_ms / numpy_ms,
    }


def print_collate_times(train: Any, max_tokens: list[int]) -> dict[str, Any]:
    """:func:`collate_times` of both architectures at each of ``max_tokens``, printed, as ``{"collate": rows}``."""
    rows = [collate_times(train, n, arch) for n in max_tokens for arch in ("encoder_decoder", "decoder_only")]
    for r in rows:
        print(
            f"collate {r['arch']:<15} max_tokens {r['max_tokens']:>6}: {r['rows']:.0f} rows, {r['target_tokens']:,.0f} "
            f"target tokens/batch; list {r['list_ms']:.2f} ms, numpy {r['numpy_ms']:.3f} ms, {r['ratio']:.1f}x"
        )
    return {"collate": rows}
