"""Greedy search, beam search and sampling over the models' KV-cached decoding interface.

One decoding path serves both model families: every function only uses
``model.start_decoding(src_tokens) -> state``, ``model.decode_step(tokens, state) -> logits`` and
``state.reorder(index)`` (see :mod:`transformer.models.state`). The encoder (or the decoder-only
source prefix) runs once per batch; cached self- and cross-attention keys/values follow the beams
through ``state.reorder``.

Conventions shared by all strategies (and relied on by :mod:`transformer.generation.translate`):

* ``Hypothesis.tokens`` holds the generated ids *without* the start token and always ends with
  exactly one EOS. When a hypothesis reaches the maximum length, EOS is forced as its next token
  (with the model's own log-probability for EOS), so "cut at max length" hypotheses also end with
  EOS and carry ``max_len + 1`` tokens.
* Maximum length per sentence: ``int(max_len_a * src_len + max_len_b)`` tokens before EOS, where
  ``src_len`` is the number of non-pad source tokens (for the encoder-decoder that includes the
  source EOS). Each sentence of a batch has its own limit, so batched and one-at-a-time decoding
  agree.
* ``min_len``: EOS is forbidden while a hypothesis has fewer than ``min_len`` tokens; the maximum
  length wins when the two conflict.
* PAD is never generated.
* Length (for the length penalty) counts the generated tokens including EOS.
* ``score`` is the length-penalised log-probability ``logprob / lp(len)`` (beam, greedy and sampling
  alike); ``logprob`` is the sum of the model's log-probabilities (temperature 1, no filtering) of
  every generated token including EOS, with the constraints above applied (banned tokens removed
  by setting them to ``-inf`` *before* the log-softmax is read, i.e. the model distribution is not
  renormalised over the allowed tokens; this is fairseq's convention).

References: Sutskever et al. 2014 and Wu et al. 2016 (GNMT length penalty
``((5 + len) / 6) ** alpha``); fairseq ``SequenceGenerator`` (``len ** alpha``, 2 x beam candidates,
``max_len_a``/``max_len_b``, ``no_repeat_ngram_size``); tensor2tensor ``beam_search`` (early
termination bound, used by Vaswani et al. 2017); Holtzman et al. 2020 (nucleus sampling);
Fan et al. 2018 (top-k sampling).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor, nn

__all__ = [
    "Hypothesis",
    "beam_search",
    "decoding",
    "generate",
    "greedy_search",
    "length_penalty",
    "max_lengths",
    "sample",
    "top_k_top_p_filter",
]


@dataclass
class Hypothesis:
    """One output sentence.

    Attributes:
        tokens: generated ids without the start token, ending with exactly one EOS.
        score: length-penalised log-probability ``logprob / lp(len(tokens))`` (higher is better).
        logprob: summed log-probability of ``tokens`` under the model (EOS included).
    """

    tokens: list[int]
    score: float
    logprob: float


# ----------------------------------------------------------------------------- helpers


def length_penalty(length: Tensor | float, alpha: float, form: str = "gnmt") -> Tensor | float:
    """The divisor of the summed log-probability.

    Args:
        length: number of generated tokens including EOS (a number or a tensor of them).
        alpha: exponent; 0 disables the penalty, > 0 favours longer outputs, < 0 shorter ones.
        form: ``gnmt`` for ``((5 + len) / 6) ** alpha`` (Wu et al. 2016, used by Vaswani et al. 2017)
            or ``fairseq`` for ``len ** alpha``.

    Returns:
        ``lp(length)`` with the type of ``length``.

    Raises:
        ValueError: unknown ``form``.
    """
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "fairseq":
        return length**alpha
    raise ValueError(f"length_penalty_form={form!r} is not one of gnmt, fairseq")


def max_lengths(src_tokens: Tensor, pad_id: int, max_len_a: float, max_len_b: int) -> Tensor:
    """Per-sentence maximum number of generated tokens before the (forced) EOS.

    Args:
        src_tokens: ``(batch, src_len)`` right-padded source.
        pad_id: padding id.
        max_len_a, max_len_b: ``int(a * n_src + b)`` with ``n_src`` the non-pad source tokens.

    Returns:
        ``(batch,)`` long tensor, at least 0.
    """
    n_src = src_tokens.ne(pad_id).sum(1).double()  # (B,)
    return (max_len_a * n_src + max_len_b).floor().long().clamp(min=0)


@contextlib.contextmanager
def decoding(model: nn.Module) -> Iterator[None]:
    """Eval mode and ``torch.inference_mode`` for the duration; the training flags are restored.

    Args:
        model: the model (may be mid-training).
    """
    was_training = [m.training for m in model.modules()]
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        for m, flag in zip(model.modules(), was_training):
            m.training = flag


def _cfg(cfg: Any, name: str, default: Any) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def _constrain(
    lprobs: Tensor,
    step: int,
    max_len: Tensor,
    *,
    pad_id: int,
    eos_id: int,
    min_len: int,
    no_repeat_ngram_size: int,
    history: Tensor,
) -> Tensor:
    """Apply PAD ban, ``min_len``, ``no_repeat_ngram_size`` and the forced EOS at max length in place.

    Args:
        lprobs: ``(rows, vocab)`` log-probabilities (or logits) of the next token.
        step: number of tokens each row has generated so far.
        max_len: ``(rows,)`` per-row maximum length (tokens before EOS).
        pad_id, eos_id: special ids.
        min_len: EOS is banned while ``step < min_len``.
        no_repeat_ngram_size: ban tokens that would repeat an n-gram of the row (0 = off).
        history: ``(rows, step)`` generated tokens so far (without the start token).

    Returns:
        ``lprobs`` (modified in place).
    """
    ninf = float("-inf")
    eos_lp = lprobs[:, eos_id].clone()  # (rows,) kept for the forced EOS
    lprobs[:, pad_id] = ninf
    if step < min_len:
        lprobs[:, eos_id] = ninf
    n = no_repeat_ngram_size
    if n > 0 and step >= n:  # at least one complete n-gram in the history
        if n == 1:
            lprobs.scatter_(1, history, ninf)
        else:
            windows = history.unfold(1, n, 1)  # (rows, step - n + 1, n)
            suffix = history[:, step - n + 1 :]  # (rows, n - 1)
            hit = (windows[:, :, :-1] == suffix[:, None, :]).all(-1)  # (rows, W)
            rows, cols = hit.nonzero(as_tuple=True)
            if rows.numel():
                lprobs[rows, windows[rows, cols, -1]] = ninf
    forced = max_len <= step  # (rows,)
    if bool(forced.any()):
        lprobs[forced] = ninf
        lprobs[forced, eos_id] = eos_lp[forced]
    return lprobs


def _lprobs(logits: Tensor) -> Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


# ----------------------------------------------------------------------------- greedy


def greedy_search(
    model: nn.Module,
    src_tokens: Tensor,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 1,
    no_repeat_ngram_size: int = 0,
    length_penalty_alpha: float = 0.0,
    length_penalty_form: str = "gnmt",
) -> list[list[Hypothesis]]:
    """Pick the most probable next token until EOS, batched over sentences.

    Finished sentences leave the batch (their cache rows are dropped through ``state.reorder``).

    Args:
        model: an encoder-decoder or decoder-only model (see module docstring).
        src_tokens: ``(batch, src_len)`` source in the model's format, right-padded.
        max_len_a, max_len_b: maximum length ``int(a * n_src + b)`` (tokens before EOS).
        min_len: minimum number of tokens before EOS.
        no_repeat_ngram_size: forbid repeating n-grams of this size (0 = off).
        length_penalty_alpha, length_penalty_form: only for ``Hypothesis.score``.

    Returns:
        ``batch`` lists with one :class:`Hypothesis` each, in input order.
    """
    with decoding(model):
        return _greedy_or_sample(
            model, src_tokens, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len,
            no_repeat_ngram_size=no_repeat_ngram_size, alpha=length_penalty_alpha,
            form=length_penalty_form, n_samples=1, temperature=0.0, top_k=0, top_p=1.0, seed=0,
        )


# ----------------------------------------------------------------------------- sampling


def top_k_top_p_filter(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set the logits outside the top-k / nucleus to ``-inf`` (in place).

    The nucleus (Holtzman et al. 2020) is the smallest set of most probable tokens whose probability
    reaches ``top_p``: a token is kept when the probability of the tokens ranked above it is below
    ``top_p``, so the token that crosses ``top_p`` is kept and the most probable token always is.

    Args:
        logits: ``(rows, vocab)`` (already divided by the temperature).
        top_k: keep the ``top_k`` largest logits (0 = all).
        top_p: nucleus mass in ``(0, 1]`` (1 = all).

    Returns:
        ``logits`` (modified in place).

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
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 1,
    no_repeat_ngram_size: int = 0,
    length_penalty_alpha: float = 0.0,
    length_penalty_form: str = "gnmt",
) -> list[list[Hypothesis]]:
    """Ancestral sampling with temperature, top-k and nucleus filtering, seeded.

    Args:
        model: an encoder-decoder or decoder-only model.
        src_tokens: ``(batch, src_len)`` source in the model's format, right-padded.
        temperature: logits are divided by it; 0 means argmax (greedy).
        top_k: sample among the ``top_k`` most probable tokens (0 = all).
        top_p: sample from the nucleus of mass ``top_p`` (1 = all).
        seed: seed of a private :class:`torch.Generator` (the global RNG is untouched).
        n_samples: independent samples per sentence (returned best first by ``score``).
        max_len_a, max_len_b, min_len, no_repeat_ngram_size: as in :func:`greedy_search`.
        length_penalty_alpha, length_penalty_form: for ``Hypothesis.score`` (ranking of samples).

    Returns:
        ``batch`` lists of ``n_samples`` hypotheses, best first, in input order.

    Raises:
        ValueError: negative temperature, or invalid ``top_k`` / ``top_p``.
    """
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    with decoding(model):
        return _greedy_or_sample(
            model, src_tokens, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len,
            no_repeat_ngram_size=no_repeat_ngram_size, alpha=length_penalty_alpha,
            form=length_penalty_form, n_samples=n_samples, temperature=temperature, top_k=top_k,
            top_p=top_p, seed=seed,
        )


def _greedy_or_sample(
    model: nn.Module,
    src_tokens: Tensor,
    *,
    max_len_a: float,
    max_len_b: int,
    min_len: int,
    no_repeat_ngram_size: int,
    alpha: float,
    form: str,
    n_samples: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
) -> list[list[Hypothesis]]:
    """Shared loop of greedy search (``temperature == 0``) and sampling; rows = batch x n_samples."""
    device = src_tokens.device
    bsz = src_tokens.shape[0]
    eos, pad = model.eos_id, model.pad_id
    state = model.start_decoding(src_tokens)
    if n_samples > 1:
        state.reorder(torch.arange(bsz, device=device).repeat_interleave(n_samples))
    rows = bsz * n_samples
    row_ids = torch.arange(rows, device=device)  # original row of each active row
    max_len = max_lengths(src_tokens, pad, max_len_a, max_len_b).repeat_interleave(n_samples)
    history = torch.empty(rows, 0, dtype=torch.long, device=device)
    logprob = torch.zeros(rows, device=device)
    prev = torch.full((rows, 1), model.decoder_start_token_id, dtype=torch.long, device=device)
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
    results: list[Hypothesis | None] = [None] * rows
    step = 0
    while True:
        logits = model.decode_step(prev, state).float()  # (rows, V)
        cons = dict(pad_id=pad, eos_id=eos, min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size,
                    history=history)
        lprobs = _constrain(_lprobs(logits), step, max_len, **cons)  # (rows, V)
        if temperature > 0:
            scaled = logits / temperature
            # the same constraints, on the scaled logits
            scaled = _constrain(scaled, step, max_len, **cons)
            scaled = top_k_top_p_filter(scaled, top_k, top_p)
            nxt = torch.multinomial(scaled.softmax(-1), 1, generator=gen).squeeze(1)  # (rows,)
        else:
            nxt = lprobs.argmax(-1)  # (rows,)
        logprob = logprob + lprobs.gather(1, nxt[:, None]).squeeze(1)
        history = torch.cat((history, nxt[:, None]), dim=1)  # (rows, step + 1)
        step += 1
        done = nxt.eq(eos)
        if bool(done.any()):
            lp = length_penalty(float(step), alpha, form)
            for i, toks, score in zip(row_ids[done].tolist(), history[done].tolist(), logprob[done].tolist()):
                results[i] = Hypothesis(tokens=toks, score=score / lp, logprob=score)
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            state.reorder(keep)
            row_ids, max_len, history, logprob, nxt = (t[keep] for t in (row_ids, max_len, history, logprob, nxt))
        prev = nxt[:, None]
    out: list[list[Hypothesis]] = []
    for b in range(bsz):
        hyps = [h for h in results[b * n_samples : (b + 1) * n_samples] if h is not None]
        hyps.sort(key=lambda h: h.score, reverse=True)
        out.append(hyps)
    return out


# ----------------------------------------------------------------------------- beam search


def beam_search(
    model: nn.Module,
    src_tokens: Tensor,
    *,
    beam_size: int = 5,
    length_penalty_alpha: float = 0.6,
    length_penalty_form: str = "gnmt",
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 1,
    no_repeat_ngram_size: int = 0,
    nbest: int = 1,
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
    its beams are finished or dead; at ``max_len`` EOS is forced. Finished sentences leave the batch.

    Args:
        model: an encoder-decoder or decoder-only model (see module docstring).
        src_tokens: ``(batch, src_len)`` source in the model's format, right-padded.
        beam_size: running beams per sentence (``K``); rows are ``batch * K``.
        length_penalty_alpha: exponent of the length penalty (0 = plain log-probability).
        length_penalty_form: ``gnmt`` or ``fairseq`` (see :func:`length_penalty`).
        max_len_a, max_len_b: maximum length ``int(a * n_src + b)`` tokens before EOS.
        min_len: minimum number of tokens before EOS.
        no_repeat_ngram_size: forbid repeating n-grams of this size within a hypothesis (0 = off).
        nbest: hypotheses returned per sentence (``<= beam_size``).

    Returns:
        ``batch`` lists of up to ``nbest`` hypotheses, best first, in input order.

    Raises:
        ValueError: ``beam_size < 1`` or ``nbest`` outside ``[1, beam_size]``.
    """
    if beam_size < 1 or not 1 <= nbest <= beam_size:
        raise ValueError(f"beam_size={beam_size} must be >= 1 and nbest={nbest} in [1, beam_size]")
    length_penalty(1.0, length_penalty_alpha, length_penalty_form)  # validates the form
    with decoding(model):
        return _beam_search(
            model, src_tokens, beam_size, length_penalty_alpha, length_penalty_form, max_len_a,
            max_len_b, min_len, no_repeat_ngram_size, nbest,
        )


def _beam_search(
    model: nn.Module,
    src_tokens: Tensor,
    K: int,
    alpha: float,
    form: str,
    max_len_a: float,
    max_len_b: int,
    min_len: int,
    no_repeat_ngram_size: int,
    nbest: int,
) -> list[list[Hypothesis]]:
    device = src_tokens.device
    bsz = src_tokens.shape[0]
    eos, pad = model.eos_id, model.pad_id
    ninf = float("-inf")
    state = model.start_decoding(src_tokens)
    state.reorder(torch.arange(bsz, device=device).repeat_interleave(K))  # (bsz * K) rows

    n = bsz  # active sentences
    sent_ids = torch.arange(bsz, device=device)  # (n,) original index of each active sentence
    max_len = max_lengths(src_tokens, pad, max_len_a, max_len_b)  # (n,)
    bound_pen = None  # lp(max_len + 1) per sentence, for the termination bound
    if alpha != 0:
        bound_pen = length_penalty(max_len.double() + 1.0, alpha, form)  # (n,)
    scores = torch.full((n, K), ninf, device=device)  # (n, K) summed log-probs of running beams
    scores[:, 0] = 0.0
    history = torch.empty(n * K, 0, dtype=torch.long, device=device)  # (n * K, step)
    prev = torch.full((n * K, 1), model.decoder_start_token_id, dtype=torch.long, device=device)
    kth_finished = torch.full((n,), ninf, dtype=torch.float64, device=device)  # nbest-th finished score
    finished: list[list[Hypothesis]] = [[] for _ in range(bsz)]
    row_base = torch.arange(n, device=device)[:, None] * K  # (n, 1)

    step = 0
    while True:
        logits = model.decode_step(prev, state)  # (n * K, V)
        vocab = logits.shape[-1]
        lprobs = _constrain(
            _lprobs(logits), step, max_len.repeat_interleave(K), pad_id=pad, eos_id=eos,
            min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size, history=history,
        )  # (n * K, V)
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
            lp = length_penalty(float(length), alpha, form)
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
            pen = torch.maximum(bound_pen, bound_pen.new_tensor(length_penalty(float(length + 1), alpha, form)))
            best_running = best_running / pen
        done = best_running <= kth_finished  # (n,); -inf (all beams dead) is always done
        if bool(done.all()):
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
    for hyps in finished:
        if not hyps:  # only reachable when the model returns -inf/NaN everywhere
            hyps = [Hypothesis(tokens=[eos], score=ninf, logprob=ninf)]
        out.append(hyps[:nbest])
    return out


# ----------------------------------------------------------------------------- dispatch


def generate(model: nn.Module, src_tokens: Tensor, cfg: Any) -> list[list[Hypothesis]]:
    """Decode a batch with the strategy named by ``cfg.strategy``.

    Runs under ``torch.inference_mode()`` with the model temporarily in eval mode (its training
    flags are restored afterwards, so the trainer can call it mid-training).

    Args:
        model: an encoder-decoder or decoder-only model.
        src_tokens: ``(batch, src_len)`` right-padded source in the model's format (encoder-decoder:
            ids + EOS; decoder-only: ids only).
        cfg: a :class:`~transformer.config.GenerationConfig` or any object/dict with its fields
            (missing fields take the dataclass defaults).

    Returns:
        One list per sentence, in input order, best first: ``nbest`` hypotheses for ``beam`` and
        ``sample`` (``nbest`` independent samples), one for ``greedy``.

    Raises:
        ValueError: unknown strategy or invalid settings.
    """
    from transformer.config import GenerationConfig

    d = GenerationConfig()
    g = {name: _cfg(cfg, name, getattr(d, name)) for name in d.__dataclass_fields__}
    common = dict(
        max_len_a=float(g["max_len_a"]), max_len_b=int(g["max_len_b"]), min_len=int(g["min_len"]),
        no_repeat_ngram_size=int(g["no_repeat_ngram_size"]),
        length_penalty_alpha=float(g["length_penalty"]), length_penalty_form=str(g["length_penalty_form"]),
    )
    strategy = g["strategy"]
    if strategy == "greedy":
        return greedy_search(model, src_tokens, **common)
    if strategy == "beam":
        return beam_search(model, src_tokens, beam_size=int(g["beam_size"]), nbest=int(g["nbest"]), **common)
    if strategy == "sample":
        return sample(
            model, src_tokens, temperature=float(g["temperature"]), top_k=int(g["top_k"]),
            top_p=float(g["top_p"]), seed=int(g["seed"]), n_samples=int(g["nbest"]), **common,
        )
    raise ValueError(f"generation.strategy={strategy!r} is not one of greedy, beam, sample")
