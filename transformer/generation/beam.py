"""Beam search batched over sentences and beams, with exact early termination (Sutskever et al.
2014; fairseq's ``SequenceGenerator``, 2 x beam candidates; tensor2tensor's termination bound).
How a step chooses and when a sentence stops: docs/decoding.md#beam-search.

A step is a stateless selection, :func:`select_candidates` (fairseq's ``BeamSearch.step``), then the
bookkeeping: :func:`finishing`, :func:`running_beams`, :func:`cannot_improve`."""

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
    max_lengths,
    nonfinite_rows,
    position_limits,
    reserve_steps,
    to_device,
    warn_nonfinite,
)
from transformer.generation.finished import Finished

__all__ = ["beam_search", "cannot_improve", "finishing", "running_beams", "select_candidates"]


def beam_search(
    model: nn.Module,
    src_tokens: Tensor,
    *,
    beam_size: int = 5,
    nbest: int = 1,
    **limits: Any,
) -> list[list[Hypothesis]]:
    """Beam search batched over sentences and beams, with exact early termination.

    Args:
        src_tokens: ``(batch, src_len)`` right-padded source in the model's format.
        beam_size: running beams per sentence (``K``); rows are ``batch * K``.
        nbest: hypotheses returned per sentence (``<= beam_size``).
        **limits: :class:`~transformer.generation.common.SearchLimits` fields; ``length_penalty_alpha``
            defaults to 0.6.

    Returns:
        ``batch`` lists of up to ``nbest`` hypotheses, best first, in input order.

    Raises:
        ValueError: ``beam_size < 1``, ``nbest`` outside ``[1, beam_size]`` or an unknown
            ``length_penalty_form``.
        TypeError: a keyword that is not a field of ``SearchLimits``.
    """
    if beam_size < 1 or not 1 <= nbest <= beam_size:
        raise ValueError(f"beam_size={beam_size} must be >= 1 and nbest={nbest} in [1, beam_size]")
    search_limits = SearchLimits(**{"length_penalty_alpha": 0.6, **limits})
    search_limits.penalty(1.0)  # validates the form
    with decoding(model):
        return _beam_search(model, src_tokens, search_limits, beam_size, nbest)


def select_candidates(lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each sentence's ``2 * K`` best one-token extensions of its beams (fairseq's ``BeamSearch.step``).

    At step 0 the other beams' ``-inf`` scores keep beam 0 alone.

    Args:
        lprobs: ``(n, K, V)`` float32 log-probabilities, overwritten with cumulative scores.
        scores: ``(n, K)`` float32 summed log-probabilities of the beams (``-inf``: dead).

    Returns:
        ``(scores, tokens, beams)``, each ``(n, min(2 * K, K * V))``, best first.
    """
    n, K, vocab = lprobs.shape
    cand = lprobs.add_(scores.view(n, K, 1)).view(n, K * vocab)  # in place: lprobs is not read again
    cand_scores, cand_idx = cand.topk(min(2 * K, K * vocab), dim=1)
    return cand_scores, cand_idx % vocab, cand_idx // vocab


def finishing(cand_scores: Tensor, is_eos: Tensor, K: int) -> Tensor:
    """``(n, K)`` bool: the candidates that finish a hypothesis, EOS with a finite score among the ``K``
    best of ``(n, C)`` candidates."""
    return (is_eos & (cand_scores > float("-inf")))[:, :K]


def running_beams(
    cand_scores: Tensor, cand_tok: Tensor, cand_beam: Tensor, is_eos: Tensor, K: int, eos: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The next ``K`` beams: the first ``K`` candidates not ending in EOS, in rank order.

    Returns:
        ``(scores, tokens, beams)``, each ``(n, K)``; a slot without a candidate (a tiny vocabulary)
        is a dead beam: ``-inf``, EOS, beam 0.
    """
    ninf = float("-inf")
    n, n_cand = cand_scores.shape
    key = torch.arange(n_cand, device=cand_scores.device)[None, :] + is_eos.long() * n_cand  # (n, C)
    pick = key.topk(min(K, n_cand), dim=1, largest=False).indices.sort(dim=1).values  # (n, K)
    new_scores = cand_scores.gather(1, pick)  # (n, K)
    new_scores = new_scores.masked_fill(cand_tok.gather(1, pick).eq(eos), ninf)
    new_beam = cand_beam.gather(1, pick)
    new_tok = cand_tok.gather(1, pick)
    if new_scores.shape[1] < K:  # tiny vocabularies: pad with dead beams
        fill = K - new_scores.shape[1]
        new_scores = torch.cat((new_scores, new_scores.new_full((n, fill), ninf)), 1)
        new_beam = torch.cat((new_beam, new_beam.new_zeros(n, fill)), 1)
        new_tok = torch.cat((new_tok, new_tok.new_full((n, fill), eos)), 1)
    return new_scores, new_tok, new_beam


def cannot_improve(running: Tensor, kth: Tensor, bound_pen: Tensor | None, next_pen: Tensor) -> Tensor:
    """``(n,)`` bool: sentences whose best running beam cannot beat their ``nbest``-th finished score
    ``kth``; all beams dead always stops.

    Args:
        running: ``(n, K)`` float32 summed log-probabilities, best first.
        kth: ``(n,)`` float64 (``-inf`` while there are fewer).
        bound_pen: ``(n,)`` float64 ``lp(max_len + 1)``, None without a length penalty.
        next_pen: 0-dim float64 ``lp(t + 1)``.
    """
    best = running[:, 0].double()  # (n,)
    if bound_pen is not None:
        best = best / torch.maximum(bound_pen, next_pen)
    return best <= kth


class _Active:
    """The sentences still searched, in the order of the search's rows: their original indices,
    ``max_len`` and termination bound's penalty, and the first row of each (``(n, 1)``, rows
    ``row_base + k`` are its beams)."""

    def __init__(self, max_len: Tensor, bound_pen: Tensor | None, K: int) -> None:
        self.ids = list(range(max_len.shape[0]))
        self.max_len, self.bound_pen, self.K = max_len, bound_pen, K
        self.row_base = torch.arange(len(self.ids), device=max_len.device)[:, None] * K  # (n, 1)

    def drop(self, done: Tensor, finished: Finished) -> tuple[Tensor, Tensor]:
        """Let the sentences ``done`` leave (their finished lists stored); return the kept rows' sentence
        indices, on the host and on the device."""
        gone = done.nonzero().squeeze(1).tolist()
        kept = (~done).nonzero().squeeze(1)  # (n',)
        finished.store(gone, [self.ids[s] for s in gone])
        keep = to_device(kept.tolist(), self.max_len.device)
        finished.select(keep)
        self.ids = [self.ids[s] for s in kept.tolist()]
        self.max_len = self.max_len.index_select(0, keep)
        if self.bound_pen is not None:
            self.bound_pen = self.bound_pen.index_select(0, keep)
        self.row_base = torch.arange(len(self.ids), device=keep.device)[:, None] * self.K
        return kept, keep


def _beam_search(
    model: nn.Module,
    src_tokens: Tensor,
    limits: SearchLimits,
    K: int,
    nbest: int,
) -> list[list[Hypothesis]]:
    """The search of :func:`beam_search`. Host reads: the longest ``max_len`` once, one packed read per
    step, and the finished hypotheses at the end."""
    alpha = limits.length_penalty_alpha
    device = src_tokens.device
    bsz = src_tokens.shape[0]
    eos, pad = model.eos_id, model.pad_id
    ninf = float("-inf")
    state = model.start_decoding(src_tokens)
    max_len = max_lengths(src_tokens, pad, limits.max_len_a, limits.max_len_b)  # (bsz,)
    cap = position_limits(model, state)
    if cap is not None:
        max_len = torch.minimum(max_len, cap)
    last_step = int(max_len.max()) if bsz else 0  # EOS is forced there: no sentence runs longer
    reserve_steps(state, last_step + 1)  # decode_step runs at steps 0 .. last_step: caches allocated once
    expand = [b for b in range(bsz) for _ in range(K)]
    state.reorder(to_device(expand, device), expand)  # (bsz * K) rows
    # lp(t) for t = 1 .. last_step + 2 at index t, computed on the host (the Python floats the scores divide by)
    penalties = torch.tensor(
        [1.0] + [float(limits.penalty(float(t))) for t in range(1, last_step + 3)], dtype=torch.float64
    )
    penalties = penalties.to(device, non_blocking=True)

    # lp(max_len + 1) per sentence, for the termination bound
    active = _Active(max_len, limits.penalty(max_len.double() + 1.0) if alpha != 0 else None, K)
    n = bsz  # active sentences
    scores = torch.full((n, K), ninf, device=device)  # (n, K) summed log-probs of running beams
    scores[:, 0] = 0.0
    history = torch.empty(n * K, 0, dtype=torch.long, device=device)  # (n * K, step)
    prev = torch.full((n * K, 1), model.decoder_start_token_id, dtype=torch.long, device=device)
    finished = Finished(bsz, K, last_step + 1, device)

    nonfinite: set[int] = set()  # sentences whose live beams met NaN/inf model output
    step = 0
    while True:
        logits = model.decode_step(prev, state)  # (n * K, V)
        vocab = logits.shape[-1]
        lprobs = constrain(
            log_probs(logits), step, active.max_len.repeat_interleave(K), history, limits, pad_id=pad, eos_id=eos
        )  # (n * K, V)
        bad = nonfinite_rows(logits) & (scores.view(-1) > ninf)  # (n * K,) live beams with NaN/inf output
        # a diverged model: those beams die (NaN scores would never end the search)
        lprobs.masked_fill_(bad[:, None], ninf)
        cand_scores, cand_tok, cand_beam = select_candidates(lprobs.view(n, K, vocab), scores)  # (n, 2K)
        is_eos = cand_tok.eq(eos)
        finished.add(
            finishing(cand_scores, is_eos, K),
            cand_scores[:, :K],
            penalties[step + 1],
            history.view(n, K, step),
            cand_beam[:, :K],
            step,
            eos,
        )
        new_scores, new_tok, new_beam = running_beams(cand_scores, cand_tok, cand_beam, is_eos, K, eos)  # (n, K)
        done = cannot_improve(new_scores, finished.kth(nbest), active.bound_pen, penalties[step + 2])  # (n,)
        # the step's one host read: done sentences, sentences with a dying beam, each new beam's parent
        status = torch.cat((done.long(), bad.view(n, K).any(1).long(), new_beam.view(-1))).cpu()
        done_h, bad_h, parents = status[:n].bool(), status[n : 2 * n].bool(), status[2 * n :].view(n, K)
        nonfinite.update(active.ids[s] for s in bad_h.nonzero().squeeze(1).tolist())
        if bool(done_h.all()) or step >= last_step:
            break
        step += 1
        rows = (active.row_base + new_beam).view(-1)  # (n * K,) parent row of each new beam
        host_rows = torch.arange(n)[:, None] * K + parents  # the same, on the host
        if bool(done_h.any()):
            kept, keep = active.drop(done_h, finished)
            rows = rows.view(n, K).index_select(0, keep).view(-1)
            host_rows = host_rows[kept]
            new_scores, new_tok = new_scores.index_select(0, keep), new_tok.index_select(0, keep)
            n = len(active.ids)
        state.reorder(rows, host_rows.view(-1).tolist())
        history = torch.cat((history.index_select(0, rows), new_tok.view(-1, 1)), dim=1)  # (n * K, step)
        scores = new_scores
        prev = new_tok.view(-1, 1)

    finished.store(list(range(n)), active.ids)
    found = finished.read(nbest)  # the search's last host read
    out = []
    for sid, hyps in enumerate(found):
        if not hyps and sid not in nonfinite:  # a model that gives -inf to every token, EOS included
            hyps = [Hypothesis(tokens=[eos], score=ninf, logprob=ninf)]
        out.append(hyps)
    if nonfinite:
        warn_nonfinite(sum(1 for sid in nonfinite if not found[sid]) or len(nonfinite))
    return out
