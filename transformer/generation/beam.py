"""Beam search batched over sentences and beams, with exact early termination.

Uses only the models' decoding interface (``start_decoding``, ``decode_step``, ``state.reorder``)
and the conventions of :mod:`transformer.generation.common`. References: Sutskever et al. 2014;
fairseq ``SequenceGenerator`` (2 x beam candidates, so finished hypotheses do not shrink the beam);
tensor2tensor ``beam_search`` (the early termination bound, used by Vaswani et al. 2017).
"""

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
    warn_nonfinite,
)

__all__ = ["beam_search"]


def beam_search(
    model: nn.Module,
    src_tokens: Tensor,
    *,
    beam_size: int = 5,
    nbest: int = 1,
    **limits: Any,
) -> list[list[Hypothesis]]:
    """Beam search batched over sentences and beams, with exact early termination.

    Each step scores every extension of the ``beam_size`` running beams of a sentence and keeps the
    ``2 * beam_size`` best candidates (fairseq): candidates ending in EOS that rank among the best
    ``beam_size`` are moved to the sentence's finished list (at most ``beam_size`` kept, best by
    length-penalised score), and the best ``beam_size`` others continue, so EOS never shrinks the
    beam. With ``beam_size=1`` and no length penalty this is greedy search, token for token. At the first step only beam 0 is
    alive (the others start at ``-inf``), so no duplicate hypotheses arise.

    A sentence stops when no running beam can still beat its ``nbest``-th finished hypothesis
    (tensor2tensor's bound, made exact for either sign of the length penalty): log-probabilities
    only decrease, so a running beam with summed log-probability ``s <= 0`` and ``t`` tokens can end
    with at best ``s / max(lp(t + 1), lp(max_len + 1))``, i.e. divided by the penalty at the longest
    allowed length when ``alpha > 0`` and at the shortest when ``alpha < 0``. It also stops when all
    its beams are finished or dead; at ``max_len`` EOS is forced, and the search never runs past
    the longest ``max_len``. Finished sentences leave the batch. Beams that receive non-finite model
    output (NaN/+inf) die; a sentence left without a finished hypothesis then gets none, with a
    :class:`~transformer.generation.common.NonFiniteOutputWarning`.

    Args:
        model: an encoder-decoder or decoder-only model (see module docstring).
        src_tokens: ``(batch, src_len)`` source in the model's format, right-padded.
        beam_size: running beams per sentence (``K``); rows are ``batch * K``.
        nbest: hypotheses returned per sentence (``<= beam_size``).
        **limits: the fields of :class:`~transformer.generation.common.SearchLimits` (maximum and
            minimum length, ``no_repeat_ngram_size``, length penalty), defaults as there except
            ``length_penalty_alpha=0.6``.

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


def _beam_search(
    model: nn.Module,
    src_tokens: Tensor,
    limits: SearchLimits,
    K: int,
    nbest: int,
) -> list[list[Hypothesis]]:
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
    state.reorder(torch.arange(bsz, device=device).repeat_interleave(K))  # (bsz * K) rows

    n = bsz  # active sentences
    sent_ids = torch.arange(bsz, device=device)  # (n,) original index of each active sentence
    bound_pen = None  # lp(max_len + 1) per sentence, for the termination bound
    if alpha != 0:
        bound_pen = limits.penalty(max_len.double() + 1.0)  # (n,)
    scores = torch.full((n, K), ninf, device=device)  # (n, K) summed log-probs of running beams
    scores[:, 0] = 0.0
    history = torch.empty(n * K, 0, dtype=torch.long, device=device)  # (n * K, step)
    prev = torch.full((n * K, 1), model.decoder_start_token_id, dtype=torch.long, device=device)
    kth_finished = torch.full((n,), ninf, dtype=torch.float64, device=device)  # nbest-th finished score
    finished: list[list[Hypothesis]] = [[] for _ in range(bsz)]
    row_base = torch.arange(n, device=device)[:, None] * K  # (n, 1)

    nonfinite: set[int] = set()  # sentences whose live beams met NaN/inf model output
    step = 0
    while True:
        logits = model.decode_step(prev, state)  # (n * K, V)
        vocab = logits.shape[-1]
        lprobs = constrain(
            log_probs(logits), step, max_len.repeat_interleave(K), history, limits, pad_id=pad, eos_id=eos
        )  # (n * K, V)
        bad = nonfinite_rows(logits) & (scores.view(-1) > ninf)  # (n * K,) live beams with NaN/inf output
        if bool(bad.any()):  # a diverged model: those beams die (NaN scores would never end the search)
            lprobs[bad] = ninf
            nonfinite.update(sent_ids[bad.view(n, K).any(1)].tolist())
        cand = (scores.view(-1, 1) + lprobs).view(n, K * vocab)  # (n, K * V)
        n_cand = min(2 * K, K * vocab)
        cand_scores, cand_idx = cand.topk(n_cand, dim=1)  # (n, 2K), sorted best first
        cand_beam = cand_idx // vocab  # (n, 2K)
        cand_tok = cand_idx % vocab  # (n, 2K)
        alive = cand_scores > ninf
        is_eos = cand_tok.eq(eos)
        length = step + 1  # tokens of a hypothesis finishing now (EOS included)

        # finished hypotheses: EOS candidates with a finite score among the K best (fairseq);
        # an EOS ranked below K non-EOS candidates is not a beam-search result
        fin = is_eos & alive  # (n, 2K)
        fin[:, K:] = False
        if bool(fin.any()):
            lp = limits.penalty(float(length))
            s_idx, c_idx = fin.nonzero(as_tuple=True)
            rows = (row_base[s_idx, 0] + cand_beam[s_idx, c_idx])  # (m,)
            toks = history[rows].tolist()
            lps = cand_scores[s_idx, c_idx].tolist()
            touched = {}
            for s, sid, t, l in zip(s_idx.tolist(), sent_ids[s_idx].tolist(), toks, lps):
                finished[sid].append(Hypothesis(tokens=t + [eos], score=l / lp, logprob=l))
                touched[s] = sid
            for s, sid in touched.items():
                hyps = finished[sid]
                hyps.sort(key=lambda h: h.score, reverse=True)  # stable: earlier (shorter) first on ties
                del hyps[K:]
                if len(hyps) >= nbest:
                    kth_finished[s] = hyps[nbest - 1].score

        # running beams: the first K non-EOS candidates (there are at least K among 2K)
        key = torch.arange(n_cand, device=device)[None, :] + is_eos.long() * n_cand  # (n, 2K)
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

        # termination: can the best running beam still beat the nbest-th finished hypothesis?
        best_running = new_scores[:, 0].double()  # (n,), sorted descending
        if alpha != 0:
            pen = torch.maximum(bound_pen, bound_pen.new_tensor(limits.penalty(float(length + 1))))
            best_running = best_running / pen
        done = best_running <= kth_finished  # (n,); -inf (all beams dead) is always done
        if bool(done.all()) or step >= last_step:
            break
        step += 1
        rows = (row_base + new_beam).view(-1)  # (n * K,) parent row of each new beam
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # (n',)
            rows = rows.view(n, K)[keep].view(-1)
            new_scores, new_tok = new_scores[keep], new_tok[keep]
            sent_ids, max_len, kth_finished = sent_ids[keep], max_len[keep], kth_finished[keep]
            if bound_pen is not None:
                bound_pen = bound_pen[keep]
            n = keep.numel()
            row_base = torch.arange(n, device=device)[:, None] * K
        state.reorder(rows)
        history = torch.cat((history[rows], new_tok.view(-1, 1)), dim=1)  # (n * K, step)
        scores = new_scores
        prev = new_tok.view(-1, 1)

    out = []
    for sid, hyps in enumerate(finished):
        if not hyps and sid not in nonfinite:  # a model that gives -inf to every token, EOS included
            hyps = [Hypothesis(tokens=[eos], score=ninf, logprob=ninf)]
        out.append(hyps[:nbest])
    if nonfinite:
        warn_nonfinite(sum(1 for sid in nonfinite if not finished[sid]) or len(nonfinite))
    return out
