"""Position encodings: sinusoidal, learned, rotary (RoPE), ALiBi and none (:data:`POSITIONS`, the
``model/position`` switch).

Each encoding answers three questions once per forward pass, so layers never branch on the kind:
:meth:`~PositionEncoding.embed` (added to the embeddings), :meth:`~PositionEncoding.rotary` (``(cos,
sin)`` for queries and keys) and :meth:`~PositionEncoding.score_bias` (added to attention scores).
Positions are explicit ``(batch, seq_len)`` LongTensors, so left-padded prompts and incremental
steps run the training code."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from transformer.modules.rope_scaling import RopeScaling, dynamic_inv_freq, rope_inv_freq


def _host_readable(positions: Tensor) -> bool:
    """Whether reading ``positions`` is free: non-empty, not on CUDA, not under ``torch.compile``."""
    return bool(positions.numel()) and not positions.is_cuda and not torch.compiler.is_compiling()


class PositionEncoding(nn.Module):
    """Base class: contributes nothing at any of the three sites.

    Fixed tables are fp32 attributes, not buffers, so ``model.to(torch.bfloat16)`` never rounds them."""

    size_keywords: ClassVar[tuple[str, ...]] = ()
    """The constructor's keywords :meth:`from_sizes` fills (of ``d_model``, ``n_heads``, ``max_positions``,
    ``rope_theta``, ``head_dim``, ``scaling``); none: built as ``cls()``."""

    @classmethod
    def from_sizes(
        cls,
        *,
        d_model: int,
        n_heads: int,
        max_positions: int,
        rope_theta: float,
        rotary_dim: int | None = None,
        rope_scaling: RopeScaling | None = None,
    ) -> PositionEncoding:
        """``cls(**{k: ... for k in cls.size_keywords})`` from the model's sizes; ``rotary_dim``
        defaults to ``d_model // n_heads`` (multi-head latent attention rotates only part of a head)."""
        sizes = dict(
            d_model=d_model, n_heads=n_heads, max_positions=max_positions, rope_theta=rope_theta, scaling=rope_scaling
        )
        if "head_dim" in cls.size_keywords:  # only RoPE's: a class without heads never divides by n_heads
            sizes["head_dim"] = rotary_dim or d_model // n_heads
        return cls(**{name: sizes[name] for name in cls.size_keywords})

    def _fp32(self, name: str, device: torch.device) -> Tensor:
        table = getattr(self, name)
        if table.device != device:
            table = table.to(device)
            setattr(self, name, table)
        return table

    def embed(self, positions: Tensor) -> Tensor | None:
        """Absolute position vectors ``(batch, seq_len, d_model)`` for ``positions`` ``(batch, seq_len)``."""
        return None

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """``(cos, sin)``, each ``(batch, 1, seq_len, head_dim)`` in fp32, for rotating q and k."""
        return None

    def score_bias(self, q_positions: Tensor, k_positions: Tensor, causal: bool) -> Tensor | None:
        """Additive attention-score bias ``(batch, n_heads, q_len, k_len)``."""
        return None


class NoPositions(PositionEncoding):
    """``model/position=none``: no position information (a causal decoder can still infer order)."""


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """``(n_positions, d_model)`` fp32 sinusoids of Vaswani et al. 2017 §3.5, interleaved as in the paper:
    ``PE[pos, 2i] = sin(pos / 10000^(2i/d_model))``, ``PE[pos, 2i+1] = cos(...)``.

    Raises:
        ValueError: ``d_model`` is odd.
    """
    if d_model % 2 != 0:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (n_positions, d_model/2)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class SinusoidalPositionalEmbedding(PositionEncoding):
    """Fixed sinusoidal positions (Vaswani et al. 2017 §3.5); longer inputs than ``max_positions``
    extend the table on the fly."""

    size_keywords = ("d_model", "max_positions")

    def __init__(self, *, d_model: int, max_positions: int = 1024) -> None:
        super().__init__()
        self.d_model = d_model
        self.table = sinusoidal_table(max_positions, d_model)

    def embed(self, positions: Tensor) -> Tensor:
        """``(batch, seq_len)`` positions -> ``(batch, seq_len, d_model)`` fp32."""
        table = self._fp32("table", positions.device)
        needed = int(positions.max()) + 1 if _host_readable(positions) else 0  # grows in eager CPU only
        if needed > table.shape[0]:
            self.table = table = sinusoidal_table(max(needed, 2 * table.shape[0]), self.d_model).to(table.device)
        return table[positions]


class LearnedPositionalEmbedding(PositionEncoding):
    """Learned absolute positions (Gehring et al. 2017; BERT/GPT-2), ``max_positions`` rows."""

    size_keywords = ("max_positions", "d_model")

    def __init__(self, *, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5)

    def embed(self, positions: Tensor) -> Tensor:
        """``(batch, seq_len)`` positions -> ``(batch, seq_len, d_model)``.

        Raises:
            ValueError: a position without a learned row (checked where reading is free).
        """
        if _host_readable(positions) and int(positions.max()) >= self.weight.shape[0]:
            raise ValueError(
                f"position {int(positions.max())} exceeds the {self.weight.shape[0]} learned positions "
                "(model.max_positions)"
            )
        return nn.functional.embedding(positions, self.weight)


class RotaryEmbedding(PositionEncoding):
    """Rotary position embedding on queries and keys (Su et al. 2021, RoFormer).

    Frequencies ``theta^(-2i/head_dim)``, or their scaled form (:mod:`transformer.modules.rope_scaling`),
    and the tables are fp32. A scaling's attention factor (YaRN) multiplies cos and sin, as in Hugging Face.

    Raises:
        ValueError: ``head_dim`` is odd or the scaling unknown.
    """

    size_keywords = ("head_dim", "rope_theta", "scaling")

    def __init__(self, *, head_dim: int, rope_theta: float = 10000.0, scaling: RopeScaling | None = None) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        self.head_dim = head_dim
        self.rope_theta = rope_theta
        self.scaling = scaling if scaling is not None and scaling.rope_type != "default" else None
        self.inv_freq, self.attention_factor = rope_inv_freq(head_dim, rope_theta, self.scaling)

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``(batch, seq_len)`` positions -> cos, sin ``(batch, 1, seq_len, head_dim)`` fp32."""
        if self.scaling is not None and self.scaling.rope_type == "dynamic":
            inv_freq = dynamic_inv_freq(self.head_dim, self.rope_theta, self.scaling, positions)
        else:
            inv_freq = self._fp32("inv_freq", positions.device)
        freqs = positions.float()[..., None] * inv_freq  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hd)
        if self.attention_factor != 1.0:
            return emb.cos() * self.attention_factor, emb.sin() * self.attention_factor
        return emb.cos(), emb.sin()


def alibi_slopes(n_heads: int) -> Tensor:
    """``(n_heads,)`` fp32 ALiBi slopes (Press et al. 2022 §3 and their code): ``2^(-8/n)`` to the powers
    ``1..n`` for a power of two ``n``; else those of the nearest smaller power ``p`` then every other
    slope of ``2p``."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        p = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(p) + power_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(PositionEncoding):
    """Attention with Linear Biases (Press et al. 2022): score bias ``-m_h * (i - j)`` causal,
    ``-m_h * |i - j|`` bidirectional; none on cross-attention."""

    size_keywords = ("n_heads",)

    def __init__(self, *, n_heads: int) -> None:
        super().__init__()
        self.slopes = alibi_slopes(n_heads)

    def score_bias(self, q_positions: Tensor, k_positions: Tensor, causal: bool) -> Tensor:
        """``(batch, q_len)``, ``(batch, k_len)`` positions -> fp32 bias ``(batch, n_heads, q_len, k_len)``."""
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).float()  # (B, Tq, Tk)
        dist = dist.clamp(min=0) if causal else dist.abs()
        return -self._fp32("slopes", q_positions.device)[None, :, None, None] * dist[:, None]


# model/position=<name> -> the class (configs/model/position/<name>.yaml sets model.position.name)
POSITIONS: dict[str, type[PositionEncoding]] = {
    "sinusoidal": SinusoidalPositionalEmbedding,
    "learned": LearnedPositionalEmbedding,
    "rope": RotaryEmbedding,
    "alibi": ALiBi,
    "none": NoPositions,
}
