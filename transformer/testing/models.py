"""The kit's tiny models and their inputs: :func:`tiny_model` (a family with options chosen), the
vocabulary and special ids (:data:`V`, :data:`PAD`, ...), batches of sources of different lengths, the
teacher-forced forward and the comparison every check raises its sentence with."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from transformer.config import GROUPS, typed_config, validate_model_config
from transformer.models import build_model

__all__ = ["ARCHS", "BOS", "EOS", "PAD", "SEP", "V", "tiny_model"]

ARCHS = ("encoder_decoder", "decoder_only")
V, PAD, BOS, EOS, SEP = 40, 0, 2, 3, 4  # the vocabulary and special ids of the checks' tiny models
_TINY = {
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
    "d_model": 32,
    "n_heads": 4,
    "d_ff": 64,
    "dropout": 0.0,
    "norm_position": "pre",
}


def tiny_model(
    arch: str = "encoder_decoder", options: dict[str, str] | None = None, **fields: Any
) -> tuple[nn.Module, DictConfig]:
    """A tiny model of family ``arch`` and its config.

    Args:
        arch: ``encoder_decoder`` or ``decoder_only``.
        options: ``{switch: option}`` (e.g. ``{"model/attention": "diff"}``), each group's node typed
            by the option's dataclass.
        fields: dotted ``model.*`` fields without the ``model.`` prefix (``attention.n_kv_heads=2``).

    Returns:
        ``(model in eval mode, model config)``.

    Raises:
        ConfigError: an invalid combination (named as by training).
    """
    model: dict[str, Any] = {**_TINY, "arch": arch}
    if arch == "decoder_only":
        model["n_encoder_layers"] = 0
    for switch, name in (options or {}).items():
        group = GROUPS[switch]
        node = model
        parts = group.path.split(".")[1:]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = {**node.get(parts[-1], {}), group.key: name}
    cfg = typed_config({"model": model}).model
    for key, value in fields.items():
        OmegaConf.update(cfg, key, value, merge=False)
    validate_model_config(cfg)
    torch.manual_seed(0)
    return build_model(cfg, V).eval(), cfg


def _src_rows(lengths: Iterable[int]) -> list[Tensor]:
    return [torch.randint(5, V, (n,)) for n in lengths]


def _source_batch(model: nn.Module, rows: list[Tensor]) -> Tensor:
    """Right-padded sources in the model's format (encoder-decoder: ids + EOS)."""
    extra = 1 if model.arch == "encoder_decoder" else 0
    src = torch.full((len(rows), max(len(r) for r in rows) + extra), PAD)
    for b, r in enumerate(rows):
        src[b, : len(r)] = r
        if extra:
            src[b, len(r)] = EOS
    return src


def _forward(model: nn.Module, src: Tensor, prev: Tensor) -> Tensor:
    """Teacher-forced logits ``(B, T, V)`` of ``prev`` (decoder inputs, BOS/SEP first) given ``src``
    (without specials; right-padded with PAD)."""
    if model.arch == "encoder_decoder":
        return model(torch.cat([src, torch.full((src.shape[0], 1), EOS)], 1), prev)
    return model(torch.cat([src, prev], 1))[:, src.shape[1] :]


def _close(a: Tensor, b: Tensor, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    try:
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    except AssertionError as err:
        raise AssertionError(
            f"{what}: {str(err).splitlines()[0]} (max |diff| {(a - b).abs().max().item():.3g})"
        ) from None
