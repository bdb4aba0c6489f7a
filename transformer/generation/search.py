""":func:`generate`: decode a batch with the strategy ``generation.strategy`` names (greedy and
sampling: :mod:`.sampling`; beam: :mod:`.beam`) over the models' KV-cached interface
(``start_decoding``, ``decode_step``, ``state.reorder``); their shared conventions are in
:mod:`.common` (docs/decoding.md#search-conventions)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from torch import Tensor, nn

from transformer.config import GenerationConfig, to_generation_config
from transformer.generation.beam import beam_search
from transformer.generation.common import (
    Hypothesis,
    SearchLimits,
)
from transformer.generation.sampling import greedy_search, sample
from transformer.precision import decoding_autocast

__all__ = ["generate"]


def generate(
    model: nn.Module, src_tokens: Tensor, cfg: GenerationConfig | Any, precision: str = "fp32"
) -> list[list[Hypothesis]]:
    """Decode a batch with ``cfg.strategy``, in eval mode and ``inference_mode`` (the training flags
    restored), under autocast in ``precision`` on an accelerator (fp32 on the CPU).

    Args:
        src_tokens: ``(batch, src_len)`` right-padded source (encoder-decoder: ids + EOS; decoder-only: ids).
        cfg: a :class:`~transformer.config.GenerationConfig`, or a mapping of some of its fields.
        precision: the run's ``train.precision``.

    Returns:
        Per sentence, in input order, best first: ``nbest`` hypotheses (beam, sample) or one (greedy).

    Raises:
        ValueError: unknown strategy, invalid settings or an unknown precision.
    """
    g = to_generation_config(cfg)
    with decoding_autocast(precision, src_tokens.device):
        return _generate(model, src_tokens, g)


def _generate(model: nn.Module, src_tokens: Tensor, g: GenerationConfig) -> list[list[Hypothesis]]:
    limits = asdict(SearchLimits.from_generation(g))
    strategy = g.strategy
    if strategy == "greedy":
        return greedy_search(model, src_tokens, **limits)
    if strategy == "beam":
        return beam_search(model, src_tokens, beam_size=int(g.beam_size), nbest=int(g.nbest), **limits)
    if strategy == "sample":
        return sample(
            model,
            src_tokens,
            temperature=float(g.temperature),
            top_k=int(g.top_k),
            top_p=float(g.top_p),
            seed=int(g.seed),
            n_samples=int(g.nbest),
            **limits,
        )
    raise ValueError(f"generation.strategy={strategy!r} is not one of greedy, beam, sample")
