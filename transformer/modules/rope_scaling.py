"""RoPE scaling: the inverse frequencies and cos/sin factor of a scaled rotary embedding, as Hugging
Face's ``ROPE_INIT_FUNCTIONS`` computes them (docs/architectures.md#rope-scaling).
:data:`ROPE_SCALINGS` is the ``model.position.rope_scaling.rope_type`` switch:

* ``default``: none (Su et al. 2021).
* ``linear``: inverse frequencies divided by ``factor`` (Chen et al. 2023).
* ``ntk``: static NTK-aware base ``theta * factor^(d/(d-2))`` (bloc97 2023).
* ``dynamic``: the NTK base from the current length ``L``,
  ``theta * (factor * L / L0 - (factor - 1))^(d/(d-2))`` once ``L > L0``.
* ``yarn``: NTK-by-parts between ``beta_fast`` and ``beta_slow`` rotations, attention factor
  ``0.1 ln(factor) + 1`` (Peng et al. 2023 §3.2-3.4).
* ``llama3``: low frequencies divided by ``factor``, high ones kept, a smooth ramp between
  wavelengths ``L0 / low_freq_factor`` and ``L0 / high_freq_factor`` (Meta 2024)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["ROPE_SCALINGS", "RopeScaling", "dynamic_inv_freq", "rope_inv_freq", "unscaled_inv_freq"]


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling's parameters, in Hugging Face's ``rope_parameters`` names.

    Attributes:
        factor: the context extension factor (>= 1; 8 in Llama 3.1).
        original_max_position_embeddings: ``L0``, the trained length in tokens.
        low_freq_factor, high_freq_factor: ``llama3``'s wavelength bounds (1 and 4 in Llama 3.1).
        beta_fast, beta_slow: ``yarn``'s ramp bounds in rotations (32 and 1).
        attention_factor: ``yarn``'s cos/sin factor; None = ``0.1 ln(factor) + 1``.
        config: the node read (a plugin's own fields for its ``from_sizes``); not compared.
    """

    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    config: Any = field(default=None, compare=False, repr=False)


def unscaled_inv_freq(head_dim: int, theta: float) -> Tensor:
    """``theta^(-2i/head_dim)`` for ``i = 0 .. head_dim/2 - 1``, fp64 ``(head_dim // 2,)``."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def _default(head_dim: int, theta: float, s: RopeScaling) -> tuple[Tensor, float]:
    return unscaled_inv_freq(head_dim, theta), 1.0


def _linear(head_dim: int, theta: float, s: RopeScaling) -> tuple[Tensor, float]:
    return unscaled_inv_freq(head_dim, theta) / s.factor, 1.0


def _ntk(head_dim: int, theta: float, s: RopeScaling) -> tuple[Tensor, float]:
    return unscaled_inv_freq(head_dim, theta * s.factor ** (head_dim / (head_dim - 2))), 1.0


def _yarn(head_dim: int, theta: float, s: RopeScaling) -> tuple[Tensor, float]:
    d, L0 = head_dim, s.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:  # the dimension that turns `rotations` times over L0
        return d * math.log(L0 / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), d - 1)
    if low == high:
        high += 0.001  # as HF: no division by zero
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = unscaled_inv_freq(d, theta)
    inv_freq = extrapolation / s.factor * ramp + extrapolation * (1 - ramp)
    attention = (
        s.attention_factor
        if s.attention_factor is not None
        else (0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0)
    )
    return inv_freq, float(attention)


def _llama3(head_dim: int, theta: float, s: RopeScaling) -> tuple[Tensor, float]:
    inv_freq = unscaled_inv_freq(head_dim, theta)
    L0 = s.original_max_position_embeddings
    low_wavelen, high_wavelen = L0 / s.low_freq_factor, L0 / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (L0 / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


# model.position.rope_scaling.rope_type=<name> -> (head_dim, rope_theta, RopeScaling) ->
# (inverse frequencies fp64 (head_dim // 2,), factor on cos/sin); `dynamic` starts unscaled and is
# rescaled per forward pass by dynamic_inv_freq. A plugin's entry may instead be a class with
# from_sizes(*, head_dim, theta, scaling[, config]) (rope_inv_freq calls it)
ROPE_SCALINGS: dict[str, Callable[..., Any]] = {
    "default": _default,  # unscaled (Su et al. 2021)
    "linear": _linear,  # position interpolation (Chen et al. 2023)
    "ntk": _ntk,  # static NTK-aware base (bloc97 2023)
    "dynamic": _default,  # dynamic NTK: rescaled from the input length (HF "dynamic")
    "yarn": _yarn,  # Peng et al. 2023
    "llama3": _llama3,  # Llama 3.1 (Meta 2024)
}


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> tuple[Tensor, float]:
    """``(inv_freq, factor)``: fp32 ``(head_dim // 2,)`` inverse frequencies and the cos/sin factor of
    ``scaling`` (None: unscaled), from its :data:`ROPE_SCALINGS` function or a plugin class's ``from_sizes``.

    Raises:
        ValueError: an unknown ``rope_type``.
    """
    scaling = scaling or RopeScaling()
    fn = ROPE_SCALINGS.get(scaling.rope_type)
    if fn is None:
        raise ValueError(f"rope_type={scaling.rope_type!r} is not one of {', '.join(ROPE_SCALINGS)}")
    from_sizes = getattr(fn, "from_sizes", None)
    if callable(from_sizes):
        kwargs: dict[str, Any] = {"head_dim": head_dim, "theta": theta, "scaling": scaling}
        if "config" in inspect.signature(from_sizes).parameters:
            kwargs["config"] = scaling.config
        inv_freq, attention = from_sizes(**kwargs)
    else:
        inv_freq, attention = fn(head_dim, theta, scaling)
    return torch.as_tensor(inv_freq).float(), float(attention)


def dynamic_inv_freq(head_dim: int, theta: float, scaling: RopeScaling, positions: Tensor) -> Tensor:
    """fp32 ``(head_dim // 2,)`` dynamic NTK inverse frequencies for ``(batch, seq_len)`` positions, from
    ``L = max(positions) + 1`` without a host sync; unscaled while ``L <= L0``."""
    if positions.numel():
        length = positions.max().double() + 1
    else:
        length = torch.ones((), dtype=torch.float64, device=positions.device)
    f, L0 = scaling.factor, scaling.original_max_position_embeddings
    stretch = (f * length / L0 - (f - 1)).clamp(min=1.0)
    base = theta * stretch ** (head_dim / (head_dim - 2))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    return (1.0 / base**exponents).float()
