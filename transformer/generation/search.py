"""Decoding strategies over the models' KV-cached decoding interface, and :func:`generate`, which
picks one from the generation settings.

One decoding path serves both model families: every strategy only uses
``model.start_decoding(src_tokens) -> state``, ``model.decode_step(tokens, state) -> logits`` and
``state.reorder(index, host_index)`` (see :mod:`transformer.models.state`; ``host_index`` is the
same indices on the host, which the searches always know, so a state never reads them back). The encoder (or the decoder-only
source prefix) runs once per batch; cached self- and cross-attention keys/values follow the beams
through ``state.reorder``.

Where things are:

* :mod:`transformer.generation.common`: :class:`Hypothesis`, :class:`SearchLimits` (maximum and
  minimum length, n-gram blocking, length penalty: the settings every strategy takes), the
  constraints applied at each step, and the conventions all strategies share.
* :mod:`transformer.generation.sampling`: :func:`greedy_search`, :func:`sample`,
  :func:`top_k_top_p_filter`.
* :mod:`transformer.generation.beam`: :func:`beam_search`; :mod:`transformer.generation.finished`
  its finished hypotheses, kept on the device.

Host reads: one per step (greedy: which rows ended or met non-finite output; beam: the same for
sentences, with each new beam's parent), and once or twice per search (beam: the longest length;
both: the hypotheses at the end); sampling also reads the non-finite rows before it draws.

The names are re-exported here and from :mod:`transformer.generation`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from torch import Tensor, nn

from transformer.config import GenerationConfig, to_generation_config
from transformer.generation.beam import beam_search
from transformer.generation.common import (
    Hypothesis,
    SearchLimits,
    decoding,
    decoding_autocast,
    decoding_precision,
    length_penalty,
    max_lengths,
)
from transformer.generation.sampling import greedy_search, sample, top_k_top_p_filter

__all__ = [
    "Hypothesis",
    "SearchLimits",
    "beam_search",
    "decoding",
    "decoding_autocast",
    "decoding_precision",
    "generate",
    "greedy_search",
    "length_penalty",
    "max_lengths",
    "sample",
    "top_k_top_p_filter",
]


def generate(
    model: nn.Module, src_tokens: Tensor, cfg: GenerationConfig | Any, precision: str = "fp32"
) -> list[list[Hypothesis]]:
    """Decode a batch with the strategy named by ``cfg.strategy``.

    Runs under ``torch.inference_mode()`` with the model temporarily in eval mode (its training
    flags are restored afterwards, so the trainer can call it mid-training), and on an accelerator
    under autocast in ``precision`` (:func:`~transformer.generation.common.decoding_autocast`; the
    CPU decodes in fp32).

    Args:
        model: an encoder-decoder or decoder-only model.
        src_tokens: ``(batch, src_len)`` right-padded source in the model's format (encoder-decoder:
            ids + EOS; decoder-only: ids only).
        cfg: a :class:`~transformer.config.GenerationConfig`, or a DictConfig / dict with some of
            its fields (the others take the dataclass defaults; see
            :func:`~transformer.config.to_generation_config`).
        precision: the run's ``train.precision`` (``auto``, ``fp32``, ``bf16``, ``fp16``), see
            :func:`~transformer.generation.common.decoding_precision`.

    Returns:
        One list per sentence, in input order, best first: ``nbest`` hypotheses for ``beam`` and
        ``sample`` (``nbest`` independent samples), one for ``greedy``.

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
