"""Greedy search and ancestral sampling (temperature, top-k: Fan et al. 2018; nucleus: Holtzman et
al. 2020): one loop over the rows of a batch, finished rows leaving it. Conventions:
docs/decoding.md#search-conventions."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from transformer.generation.common import (
    Hypothesis,
    SearchLimits,
    constrain,
    decoding,
    log_probs,
    max_length_bound,
    max_lengths,
    nonfinite_rows,
    position_limits,
    reserve_steps,
    to_device,
    warn_nonfinite,
)

__all__ = ["greedy_search", "sample", "top_k_top_p_filter"]


def greedy_search(model: nn.Module, src_tokens: Tensor, **limits: Any) -> list[list[Hypothesis]]:
    """Pick the most probable next token until EOS, batched over sentences.

    Args:
        src_tokens: ``(batch, src_len)`` right-padded source in the model's format.
        **limits: :class:`~transformer.generation.common.SearchLimits` fields (the length penalty only
            sets ``Hypothesis.score``).

    Returns:
        ``batch`` lists with one :class:`Hypothesis` each, in input order.

    Raises:
        TypeError: a keyword that is not a field of ``SearchLimits``.
    """
    with decoding(model):
        return _greedy_or_sample(
            model, src_tokens, SearchLimits(**limits), n_samples=1, temperature=0.0, top_k=0, top_p=1.0, seed=0
        )


def top_k_top_p_filter(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set ``(rows, vocab)`` logits outside the top-k (0: all) and the nucleus of mass ``top_p`` (1: all)
    to ``-inf``, in place. The token crossing ``top_p`` is kept, and so is the most probable one.

    Raises:
        ValueError: ``top_p`` outside ``(0, 1]`` or negative ``top_k``.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0")
    ninf = float("-inf")
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (rows, 1)
        logits.masked_fill_(logits < kth, ninf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (rows, vocab)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability ranked strictly above each token
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(1, order, drop_sorted)
        logits.masked_fill_(drop, ninf)
    return logits


def sample(
    model: nn.Module,
    src_tokens: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    n_samples: int = 1,
    **limits: Any,
) -> list[list[Hypothesis]]:
    """Ancestral sampling with temperature (0: argmax), top-k and nucleus filtering.

    Args:
        src_tokens: ``(batch, src_len)`` right-padded source in the model's format.
        seed: seed of a private :class:`torch.Generator` (the global RNG is untouched).
        n_samples: samples per sentence, returned best first by ``score``.
        **limits: :class:`~transformer.generation.common.SearchLimits` fields.

    Returns:
        ``batch`` lists of ``n_samples`` hypotheses, in input order.

    Raises:
        ValueError: negative temperature, or invalid ``top_k`` / ``top_p``.
        TypeError: a keyword that is not a field of ``SearchLimits``.
    """
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    with decoding(model):
        return _greedy_or_sample(
            model,
            src_tokens,
            SearchLimits(**limits),
            n_samples=n_samples,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
        )


def _greedy_or_sample(
    model: nn.Module,
    src_tokens: Tensor,
    limits: SearchLimits,
    *,
    n_samples: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
) -> list[list[Hypothesis]]:
    """Shared loop of greedy search (``temperature == 0``) and sampling; rows = batch x n_samples. One
    host read per step (ended rows, non-finite rows; sampling reads the latter once more before it
    draws); finished tokens stay on the device until the end."""
    device = src_tokens.device
    bsz = src_tokens.shape[0]
    eos, pad = model.eos_id, model.pad_id
    state = model.start_decoding(src_tokens)
    max_len = max_lengths(src_tokens, pad, limits.max_len_a, limits.max_len_b)  # (bsz,)
    cap = position_limits(model, state)
    if cap is not None:
        max_len = torch.minimum(max_len, cap)
    max_len = max_len.repeat_interleave(n_samples)  # (rows,)
    # a row ends at the step after its max_len at the latest; the bound needs no read of the device
    reserve_steps(state, max_length_bound(src_tokens, limits.max_len_a, limits.max_len_b) + 1)
    if n_samples > 1:
        expand = [b for b in range(bsz) for _ in range(n_samples)]
        state.reorder(to_device(expand, device), expand)
    rows = bsz * n_samples
    row_ids = list(range(rows))  # original row of each active row
    history = torch.empty(rows, 0, dtype=torch.long, device=device)
    logprob = torch.zeros(rows, device=device)
    prev = torch.full((rows, 1), model.decoder_start_token_id, dtype=torch.long, device=device)
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
    ended: list[tuple[list[int], int, Tensor, Tensor]] = []  # (rows, length, tokens, logprobs), on the device
    failed: set[int] = set()  # rows that met non-finite model output
    step = 0
    while True:
        logits = model.decode_step(prev, state).float()  # (rows, V)
        bad = nonfinite_rows(logits)  # (rows,)
        if gen is not None and bool(bad.any()):  # sampling: drop them before the draw
            keep = (~bad).nonzero().squeeze(1)
            failed.update(row_ids[i] for i in bad.nonzero().squeeze(1).tolist())
            if keep.numel() == 0:
                break
            kept = keep.tolist()
            state.reorder(keep, kept)
            row_ids = [row_ids[i] for i in kept]
            max_len, history, logprob, logits, bad = (t[keep] for t in (max_len, history, logprob, logits, bad))
        forced = max_len <= step  # (rows,) EOS is the only choice, whatever the model says of it
        lprobs = constrain(log_probs(logits), step, max_len, history, limits, pad_id=pad, eos_id=eos)  # (rows, V)
        if temperature > 0:
            scaled = logits / temperature
            # the same constraints, on the scaled logits
            scaled = constrain(scaled, step, max_len, history, limits, pad_id=pad, eos_id=eos)
            scaled = top_k_top_p_filter(scaled, top_k, top_p)
            scaled[:, eos] = scaled[:, eos].masked_fill(
                forced, 0.0
            )  # a finite EOS logit even where the model gives EOS -inf
            nxt = torch.multinomial(scaled.softmax(-1), 1, generator=gen).squeeze(1)  # (rows,)
        else:
            nxt = lprobs.argmax(-1)  # (rows,)
        nxt = nxt.masked_fill(forced, eos)  # the length bound always ends a row
        logprob = logprob + lprobs.gather(1, nxt[:, None]).squeeze(1)
        history = torch.cat((history, nxt[:, None]), dim=1)  # (rows, step + 1)
        step += 1
        status = torch.stack((nxt.eq(eos) & ~bad, bad)).cpu()  # (2, rows): the step's one host read
        done, bad_rows = status[0].nonzero().squeeze(1).tolist(), status[1].nonzero().squeeze(1).tolist()
        if done:
            idx = to_device(done, device)
            ended.append(([row_ids[i] for i in done], step, history.index_select(0, idx), logprob.index_select(0, idx)))
        if bad_rows:  # a diverged model: these rows end without a hypothesis
            failed.update(row_ids[i] for i in bad_rows)
        if done or bad_rows:
            kept = (~(status[0] | status[1])).nonzero().squeeze(1).tolist()
            if not kept:
                break
            keep = to_device(kept, device)
            state.reorder(keep, kept)
            row_ids = [row_ids[i] for i in kept]
            max_len, history, logprob, nxt = (t.index_select(0, keep) for t in (max_len, history, logprob, nxt))
        prev = nxt[:, None]
    if failed:
        warn_nonfinite(len({i // n_samples for i in failed}))
    results = _hypotheses(ended, rows, limits)
    out: list[list[Hypothesis]] = []
    for b in range(bsz):
        hyps = [h for h in results[b * n_samples : (b + 1) * n_samples] if h is not None]
        hyps.sort(key=lambda h: h.score, reverse=True)
        out.append(hyps)
    return out


def _hypotheses(
    ended: list[tuple[list[int], int, Tensor, Tensor]], rows: int, limits: SearchLimits
) -> list[Hypothesis | None]:
    """The finished rows' hypotheses by original row (None for rows without one), from one host
    read: every finished row's tokens, then the bits of their float32 log-probabilities."""
    results: list[Hypothesis | None] = [None] * rows
    if not ended:
        return results
    tokens = torch.cat([t.reshape(-1) for _, _, t, _ in ended])
    logprobs = torch.cat([lp for _, _, _, lp in ended])
    packed = torch.cat((tokens, logprobs.view(torch.int32).long())).cpu()
    tokens, logprobs = packed[: tokens.numel()].tolist(), packed[tokens.numel() :].int().view(torch.float32).tolist()
    at, k = 0, 0
    for ids, length, _, _ in ended:
        lp = limits.penalty(float(length))
        for i in ids:
            score = logprobs[k]
            results[i] = Hypothesis(tokens=tokens[at : at + length], score=score / lp, logprob=score)
            at, k = at + length, k + 1
    return results
