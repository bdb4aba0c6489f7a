"""What greedy search, beam search and sampling share: the output type, the length limits and
penalty, the token constraints and the decoding precision. The conventions every strategy follows
(EOS, lengths, scores, non-finite output) are in docs/decoding.md#search-conventions.

References: Wu et al. 2016 (GNMT length penalty); fairseq ``SequenceGenerator`` (``len ** alpha``,
``max_len_a``/``max_len_b``, ``no_repeat_ngram_size``)."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from transformer.config import GenerationConfig
from transformer.modules.positions import LearnedPositionalEmbedding

__all__ = [
    "Hypothesis",
    "NonFiniteOutputWarning",
    "SearchLimits",
    "constrain",
    "decoding",
    "length_penalty",
    "learned_positions",
    "log_probs",
    "max_length_bound",
    "max_lengths",
    "nonfinite_rows",
    "position_limits",
    "reserve_steps",
    "to_device",
    "warn_nonfinite",
]


@dataclass
class Hypothesis:
    """One output sentence.

    Attributes:
        tokens: generated ids without the start token, ending with exactly one EOS.
        score: ``logprob / lp(len(tokens))`` (higher is better).
        logprob: summed log-probability of ``tokens`` under the model (EOS included).
    """

    tokens: list[int]
    score: float
    logprob: float


@dataclass(frozen=True)
class SearchLimits:
    """The settings every search strategy takes as keyword arguments.

    Attributes:
        max_len_a, max_len_b: at most ``int(a * n_src + b)`` tokens before EOS (:func:`max_lengths`).
        min_len: minimum number of tokens before EOS.
        no_repeat_ngram_size: forbid repeating n-grams of this size within a hypothesis (0 = off).
        length_penalty_alpha, length_penalty_form: see :func:`length_penalty`.
    """

    max_len_a: float = 1.0
    max_len_b: int = 50
    min_len: int = 1
    no_repeat_ngram_size: int = 0
    length_penalty_alpha: float = 0.0
    length_penalty_form: str = "gnmt"

    @classmethod
    def from_generation(cls, g: GenerationConfig) -> SearchLimits:
        """The limits of generation settings ``g`` (``length_penalty`` -> ``length_penalty_alpha``)."""
        return cls(
            max_len_a=float(g.max_len_a),
            max_len_b=int(g.max_len_b),
            min_len=int(g.min_len),
            no_repeat_ngram_size=int(g.no_repeat_ngram_size),
            length_penalty_alpha=float(g.length_penalty),
            length_penalty_form=str(g.length_penalty_form),
        )

    def penalty(self, length: Tensor | float) -> Tensor | float:
        """:func:`length_penalty` of ``length`` with this alpha and form."""
        return length_penalty(length, self.length_penalty_alpha, self.length_penalty_form)


def length_penalty(length: Tensor | float, alpha: float, form: str = "gnmt") -> Tensor | float:
    """The divisor of the summed log-probability: ``((5 + len) / 6) ** alpha`` for ``gnmt`` (Wu et
    al. 2016), ``len ** alpha`` for ``fairseq``. ``length`` counts tokens including EOS (a number or a
    tensor); alpha 0 disables the penalty, > 0 favours longer outputs.

    Raises:
        ValueError: unknown ``form``.
    """
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "fairseq":
        return length**alpha
    raise ValueError(f"length_penalty_form={form!r} is not one of gnmt, fairseq")


def max_lengths(src_tokens: Tensor, pad_id: int, max_len_a: float, max_len_b: int) -> Tensor:
    """``(batch,)`` long: ``int(a * n_src + b)`` tokens before EOS per row of ``(batch, src_len)``
    right-padded ``src_tokens``, ``n_src`` its non-pad tokens; at least 0."""
    n_src = src_tokens.ne(pad_id).sum(1).double()  # (B,)
    return (max_len_a * n_src + max_len_b).floor().long().clamp(min=0)


def max_length_bound(src_tokens: Tensor, max_len_a: float, max_len_b: int) -> int:
    """Host-known upper bound of every row's :func:`max_lengths`, from the padded width:
    ``int(max(a, 0) * src_len + b)``, at least 0."""
    return max(0, math.floor(max(max_len_a, 0.0) * src_tokens.shape[1] + max_len_b))


def reserve_steps(state: Any, steps: int) -> None:
    """Tell a decoding state that at most ``steps`` ``decode_step`` calls follow, so its KV caches
    allocate once; a state without ``reserve`` is left as it is."""
    reserve = getattr(state, "reserve", None)
    if reserve is not None:
        reserve(steps)


def learned_positions(embedding: nn.Module | None) -> int | None:
    """Rows of an embedding's learned position table (``model/position=learned``), else None."""
    position = getattr(embedding, "position", None)
    return position.weight.shape[0] if isinstance(position, LearnedPositionalEmbedding) else None


def _decoder_embedding(model: nn.Module) -> nn.Module | None:
    for name in ("tgt_embed", "embed"):  # encoder-decoder, decoder-only
        if getattr(model, name, None) is not None:
            return getattr(model, name)
    return None


def position_limits(model: nn.Module, state: Any) -> Tensor | None:
    """``(batch,)`` long: the most tokens before EOS the decoder's learned positions allow, or None.

    The token chosen at step ``t`` is predicted from position ``start + t`` (``state.positions`` right
    after ``start_decoding``), so ``max_len <= rows - 1 - start``. An ensemble takes its tightest member."""
    members = getattr(model, "models", None)
    if members is not None:  # an ensemble: the tightest limit of its members
        caps = [c for c in (position_limits(m, s) for m, s in zip(members, state.states)) if c is not None]
        return torch.stack(caps).amin(0) if caps else None
    rows = learned_positions(_decoder_embedding(model))
    start = getattr(state, "positions", None)
    if rows is None or start is None:
        return None
    return (rows - 1 - start).clamp(min=0)


class NonFiniteOutputWarning(RuntimeWarning):
    """The model returned NaN or +inf logits (a diverged model): those sentences got no hypothesis."""


def nonfinite_rows(logits: Tensor) -> Tensor:
    """``(rows,)`` bool: rows of ``(rows, vocab)`` logits holding NaN or +inf (-inf is a masked token)."""
    top = logits.amax(-1)  # (rows,)
    return top.isnan() | top.isposinf()


def warn_nonfinite(n_sentences: int) -> None:
    """Warn that ``n_sentences`` sentences met non-finite model output (their hypotheses are empty)."""
    warnings.warn(
        f"non-finite model output (NaN/inf logits) for {n_sentences} sentence(s): they get no hypothesis "
        "(an empty output); a diverged model? check the run's training loss and grad_norm",
        NonFiniteOutputWarning,
        stacklevel=3,
    )


@contextlib.contextmanager
def decoding(model: nn.Module) -> Iterator[None]:
    """Eval mode and ``torch.inference_mode`` for the duration; the training flags are restored."""
    was_training = [m.training for m in model.modules()]
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        for m, flag in zip(model.modules(), was_training):
            m.training = flag


def constrain(
    lprobs: Tensor, step: int, max_len: Tensor, history: Tensor, limits: SearchLimits, *, pad_id: int, eos_id: int
) -> Tensor:
    """Apply the PAD ban, ``min_len``, ``no_repeat_ngram_size`` and the forced EOS at max length, in
    place and without a host read.

    Args:
        lprobs: ``(rows, vocab)`` log-probabilities (or logits) of the next token.
        step: number of tokens each row has generated so far.
        max_len: ``(rows,)`` per-row maximum length (tokens before EOS).
        history: ``(rows, step)`` generated tokens so far (without the start token).

    Returns:
        ``lprobs``.
    """
    ninf = float("-inf")
    eos_lp = lprobs[:, eos_id].clone()  # (rows,) kept for the forced EOS
    lprobs[:, pad_id] = ninf
    if step < limits.min_len:
        lprobs[:, eos_id] = ninf
    n = limits.no_repeat_ngram_size
    if n > 0 and step >= n:  # at least one complete n-gram in the history
        if n == 1:
            lprobs.scatter_(1, history, ninf)
        else:
            windows = history.unfold(1, n, 1)  # (rows, step - n + 1, n)
            suffix = history[:, step - n + 1 :]  # (rows, n - 1)
            hit = (windows[:, :, :-1] == suffix[:, None, :]).all(-1)  # (rows, W)
            # ban the token ending each matching window; the others write -inf to PAD, banned already
            lprobs.scatter_(1, windows[:, :, -1].masked_fill(~hit, pad_id), ninf)
    forced = (max_len <= step)[:, None]  # (rows, 1): EOS with the model's own score, nothing else
    lprobs.masked_fill_(forced, ninf)
    lprobs[:, eos_id] = torch.where(forced[:, 0], eos_lp, lprobs[:, eos_id])
    return lprobs


def to_device(values: list[int], device: torch.device) -> Tensor:
    """``values`` as a long tensor on ``device``, copied with ``non_blocking`` (a blocking copy from
    pageable memory synchronizes the stream)."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def log_probs(logits: Tensor) -> Tensor:
    """``(rows, vocab)`` logits -> float32 log-probabilities."""
    return torch.log_softmax(logits.float(), dim=-1)
