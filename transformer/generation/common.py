"""What greedy search, beam search and sampling share: the output type, the length limits and
penalty, the token constraints, and the generation settings as one typed object.

Conventions shared by all strategies (and relied on by :mod:`transformer.generation.translate`):

* ``Hypothesis.tokens`` holds the generated ids *without* the start token and always ends with
  exactly one EOS. When a hypothesis reaches the maximum length, EOS is forced as its next token
  (with the model's own log-probability for EOS), so "cut at max length" hypotheses also end with
  EOS and carry ``max_len + 1`` tokens.
* Maximum length per sentence: ``int(max_len_a * src_len + max_len_b)`` tokens before EOS, where
  ``src_len`` is the number of non-pad source tokens (for the encoder-decoder that includes the
  source EOS). Each sentence of a batch has its own limit, so batched and one-at-a-time decoding
  agree.
  A model with learned positions (``model/position=learned``) caps it further, so that no token
  is ever fed at a position past its table (:func:`position_limits`): search always stops at its
  length bound.
* ``min_len``: EOS is forbidden while a hypothesis has fewer than ``min_len`` tokens; the maximum
  length wins when the two conflict.
* Non-finite model output (NaN or +inf logits, e.g. from a diverged model) ends the rows that
  receive it: a sentence left without a hypothesis gets none (an empty list), and a
  :class:`NonFiniteOutputWarning` says so. Search never loops on NaN scores.
* PAD is never generated.
* Length (for the length penalty) counts the generated tokens including EOS.
* ``score`` is the length-penalised log-probability ``logprob / lp(len)`` (beam, greedy and sampling
  alike); ``logprob`` is the sum of the model's log-probabilities (temperature 1, no filtering) of
  every generated token including EOS, with the constraints above applied (banned tokens removed
  by setting them to ``-inf`` *before* the log-softmax is read, i.e. the model distribution is not
  renormalised over the allowed tokens; this is fairseq's convention).

References: Wu et al. 2016 (GNMT length penalty ``((5 + len) / 6) ** alpha``); fairseq
``SequenceGenerator`` (``len ** alpha``, ``max_len_a``/``max_len_b``, ``no_repeat_ngram_size``).
"""

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
from transformer.device import cuda_has_fast_bf16
from transformer.modules.positions import LearnedPositionalEmbedding

__all__ = [
    "Hypothesis",
    "DECODING_PRECISIONS",
    "FP32_DEVICES",
    "NonFiniteOutputWarning",
    "SearchLimits",
    "autocast_dtype",
    "constrain",
    "decoding",
    "decoding_autocast",
    "decoding_precision",
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
        score: length-penalised log-probability ``logprob / lp(len(tokens))`` (higher is better).
        logprob: summed log-probability of ``tokens`` under the model (EOS included).
    """

    tokens: list[int]
    score: float
    logprob: float


@dataclass(frozen=True)
class SearchLimits:
    """The settings every search strategy takes (the keyword arguments of
    :func:`~transformer.generation.sampling.greedy_search`, :func:`~transformer.generation.sampling.sample`
    and :func:`~transformer.generation.beam.beam_search`).

    Attributes:
        max_len_a, max_len_b: maximum length ``int(a * n_src + b)`` tokens before EOS
            (see :func:`max_lengths`).
        min_len: minimum number of tokens before EOS.
        no_repeat_ngram_size: forbid repeating n-grams of this size within a hypothesis (0 = off).
        length_penalty_alpha: exponent of the length penalty (0 = plain log-probability).
        length_penalty_form: ``gnmt`` or ``fairseq`` (see :func:`length_penalty`).
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


def max_length_bound(src_tokens: Tensor, max_len_a: float, max_len_b: int) -> int:
    """A host-known upper bound of every row's :func:`max_lengths` (read from the padded width, not
    from the device): ``int(max(a, 0) * src_len + b)``, at least 0.

    Args:
        src_tokens: ``(batch, src_len)`` right-padded source.
        max_len_a, max_len_b: as in :func:`max_lengths`.
    """
    return max(0, math.floor(max(max_len_a, 0.0) * src_tokens.shape[1] + max_len_b))


def reserve_steps(state: Any, steps: int) -> None:
    """Tell a decoding state how many ``decode_step`` calls may still come (its KV caches then
    allocate once: :meth:`transformer.models.state.DecodingState.reserve`); a state without
    ``reserve`` (a model of one's own) is left as it is.

    Args:
        state: from the model's ``start_decoding``.
        steps: the most ``decode_step`` calls the search will make.
    """
    reserve = getattr(state, "reserve", None)
    if reserve is not None:
        reserve(steps)


def learned_positions(embedding: nn.Module | None) -> int | None:
    """Rows of an embedding's learned position table (``model/position=learned``), else None.

    Args:
        embedding: a :class:`~transformer.modules.embedding.TokenEmbedding` (or None).

    Returns:
        ``model.max_positions`` for learned positions; None for encodings without a limit.
    """
    position = getattr(embedding, "position", None)
    return position.weight.shape[0] if isinstance(position, LearnedPositionalEmbedding) else None


def _decoder_embedding(model: nn.Module) -> nn.Module | None:
    for name in ("tgt_embed", "embed"):  # encoder-decoder, decoder-only
        if getattr(model, name, None) is not None:
            return getattr(model, name)
    return None


def position_limits(model: nn.Module, state: Any) -> Tensor | None:
    """Per-row maximum length (tokens before EOS) that the decoder's learned positions allow.

    The token chosen at step ``t`` is predicted from the input at position ``start + t`` (``start``:
    ``state.positions`` before the first step: 0 for the encoder-decoder, the source length for
    the decoder-only model), so ``max_len <= rows - 1 - start``.

    Args:
        model: the model being decoded (an ensemble: its tightest member).
        state: its decoding state right after ``start_decoding`` (``positions``: ``(batch,)``).

    Returns:
        ``(batch,)`` long tensor, or None when the positions have no limit.
    """
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
    """``(rows,)`` bool: rows of ``(rows, vocab)`` logits holding NaN or +inf (-inf is a masked token).

    Read from each row's maximum (``amax`` propagates NaN, and +inf is the largest value): one pass
    over the logits and a ``(rows,)`` result, not two ``(rows, vocab)`` masks."""
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


DECODING_PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""The precisions decoding takes: ``train.precision``'s values."""
FP32_DEVICES = ("cpu",)
"""Device types that decode in fp32 whatever the run's precision: the CPU, whose decoding speed is
measured in fp32 (``docs/benchmarks/decode_speed.md``) and whose fp32 hypotheses the tests hold; a
CPU with fast bf16 trains in bf16 under ``train.precision=auto`` and still decodes in fp32."""
_AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def decoding_precision(precision: str, device: torch.device | str) -> str:
    """The precision decoding runs in on ``device`` for a run of ``train.precision=precision``.

    fp32 on the devices of :data:`FP32_DEVICES` (the CPU); elsewhere the run's own: ``bf16`` and
    ``fp16`` as they are (an fp16 run decodes in fp16, the format its activations were trained
    in), ``auto`` as :func:`~transformer.training.step.precision.resolve_precision` resolves it on
    an accelerator (``bf16`` on a CUDA device of compute capability 8.0 or more, else ``fp32``).

    Args:
        precision: ``auto`` | ``fp32`` | ``bf16`` | ``fp16``.
        device: where the model decodes.

    Returns:
        ``fp32``, ``bf16`` or ``fp16``.

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in DECODING_PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(DECODING_PRECISIONS)}")
    device = torch.device(device)
    if device.type in FP32_DEVICES:
        return "fp32"
    if precision == "auto":
        return "bf16" if cuda_has_fast_bf16(device) else "fp32"
    return precision


def autocast_dtype(precision: str, device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype of decoding (:func:`decoding_precision`), None for fp32 (no autocast)."""
    return _AUTOCAST[decoding_precision(precision, device)]


def decoding_autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in the decoding precision of ``precision`` on ``device``
    (:func:`decoding_precision`), or a context that changes nothing for fp32. The matrix products
    run in the autocast dtype, the KV caches hold it; the searches' log-probabilities stay fp32
    (:func:`log_probs`).

    Raises:
        ValueError: an unknown precision.
    """
    dtype = autocast_dtype(precision, device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


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


def constrain(
    lprobs: Tensor, step: int, max_len: Tensor, history: Tensor, limits: SearchLimits, *, pad_id: int, eos_id: int
) -> Tensor:
    """Apply PAD ban, ``min_len``, ``no_repeat_ngram_size`` and the forced EOS at max length in place.

    Reads nothing back on the host: every mask is computed on the device from ``step`` (which the
    host knows), ``max_len`` and ``history``.

    Args:
        lprobs: ``(rows, vocab)`` log-probabilities (or logits) of the next token.
        step: number of tokens each row has generated so far.
        max_len: ``(rows,)`` per-row maximum length (tokens before EOS).
        history: ``(rows, step)`` generated tokens so far (without the start token).
        limits: ``min_len`` (EOS is banned while ``step < min_len``) and ``no_repeat_ngram_size``
            (ban tokens that would repeat an n-gram of the row; 0 = off).
        pad_id, eos_id: special ids.

    Returns:
        ``lprobs`` (modified in place).
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
    """``values`` (host ints) as a long tensor on ``device``, copied without waiting for the device
    (a copy from pageable memory that is not ``non_blocking`` synchronizes the stream)."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def log_probs(logits: Tensor) -> Tensor:
    """``(rows, vocab)`` logits -> float32 log-probabilities."""
    return torch.log_softmax(logits.float(), dim=-1)
