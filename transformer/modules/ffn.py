"""Position-wise feed-forward blocks: two-matrix (ReLU, GELU) and gated (SwiGLU, GEGLU).
:data:`FFNS` is the ``model/ffn`` switch (option -> block class and activation), read by the
validation, the builder and the FLOPs count; ``moe``'s experts are another entry's blocks
(``model.ffn.expert``, :mod:`transformer.modules.moe`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from transformer.modules.dropout import Dropout
from transformer.modules.moe import MixtureOfExperts


def glu_hidden_size(d_ff: int, multiple_of: int = 8) -> int:
    """``multiple_of * ceil(int(2 * d_ff / 3) / multiple_of)``: a gated FFN's hidden width with the
    parameters of a two-matrix FFN of width ``d_ff`` (Shazeer 2020 §2; Llama's rounding)."""
    h = int(2 * d_ff / 3)
    return multiple_of * math.ceil(h / multiple_of)


class FeedForward(nn.Module):
    """``w2(dropout(act(w1 x)))`` (Vaswani et al. 2017 §3.3 with ReLU; GELU: Hendrycks & Gimpel 2016);
    ``w1`` ``d_model -> d_ff``, ``w2`` back, ``dropout`` on the activations."""

    n_matrices: ClassVar[int] = 2  # d_model x hidden matrices (parameter and FLOP counts)

    def __init__(self, *, w1: nn.Linear, w2: nn.Linear, activation: Callable[[Tensor], Tensor], dropout: float = 0.0):
        super().__init__()
        self.w1, self.w2, self.activation = w1, w2, activation
        self.dropout = Dropout(dropout)

    @staticmethod
    def hidden_size(d_ff: int, glu_match_params: bool, multiple_of: int) -> int:
        """The hidden width: ``d_ff`` (the GLU sizing options do not apply)."""
        return d_ff

    @classmethod
    def from_sizes(
        cls, *, d_model: int, hidden: int, activation: Callable[[Tensor], Tensor], bias: bool, dropout: float
    ) -> FeedForward:
        """The block with fresh Linear layers ``d_model -> hidden -> d_model``."""
        return cls(
            w1=nn.Linear(d_model, hidden, bias=bias),
            w2=nn.Linear(hidden, d_model, bias=bias),
            activation=activation,
            dropout=dropout,
        )

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq_len, d_model) -> (batch, seq_len, d_model)``."""
        return self.w2(self.dropout(self.activation(self.w1(x))))


class GatedFeedForward(nn.Module):
    """``w2(dropout(act(x W_gate) * (x W_up)))``: SwiGLU (SiLU) or GEGLU (GELU), Shazeer 2020.
    ``w13`` is Linear ``d_model -> 2 * hidden``, gate rows first (HF ``gate_proj`` and ``up_proj``
    stacked); ``w2`` is ``down_proj``."""

    n_matrices: ClassVar[int] = 3  # gate, up, down

    def __init__(self, *, w13: nn.Linear, w2: nn.Linear, activation: Callable[[Tensor], Tensor], dropout: float = 0.0):
        super().__init__()
        if w13.out_features != 2 * w2.in_features:
            raise ValueError(f"w13 has {w13.out_features} outputs, expected 2 * {w2.in_features}")
        self.w13, self.w2, self.activation = w13, w2, activation
        self.dropout = Dropout(dropout)

    @staticmethod
    def hidden_size(d_ff: int, glu_match_params: bool, multiple_of: int) -> int:
        """The hidden width: :func:`glu_hidden_size` of ``d_ff`` when ``glu_match_params``
        (parameters matched to a two-matrix block of width ``d_ff``), else ``d_ff``."""
        return glu_hidden_size(d_ff, multiple_of) if glu_match_params else d_ff

    @classmethod
    def from_sizes(
        cls, *, d_model: int, hidden: int, activation: Callable[[Tensor], Tensor], bias: bool, dropout: float
    ) -> GatedFeedForward:
        """The block with fresh Linear layers ``d_model -> 2 * hidden`` and ``hidden -> d_model``."""
        return cls(
            w13=nn.Linear(d_model, 2 * hidden, bias=bias),
            w2=nn.Linear(hidden, d_model, bias=bias),
            activation=activation,
            dropout=dropout,
        )

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq_len, d_model) -> (batch, seq_len, d_model)``."""
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(self.dropout(self.activation(gate) * up))


@dataclass(frozen=True)
class FFNChoice:
    """One option of ``model/ffn``: the block class and its activation (None for ``moe``, whose
    experts take the activation of the ``model.ffn.expert`` entry)."""

    block: type[FeedForward] | type[GatedFeedForward] | type[MixtureOfExperts]
    activation: Callable[[Tensor], Tensor] | None

    @property
    def gated(self) -> bool:
        """Whether the block is gated (three matrices, GLU family)."""
        return issubclass(self.block, GatedFeedForward)

    @property
    def routed(self) -> bool:
        """Whether the block is a mixture of experts (sized by the ``model.ffn`` MoE fields)."""
        return issubclass(self.block, MixtureOfExperts)


# model/ffn=<name> -> FFNChoice (configs/model/ffn/<name>.yaml sets model.ffn.name)
FFNS: dict[str, FFNChoice] = {
    "relu": FFNChoice(FeedForward, F.relu),
    "gelu": FFNChoice(FeedForward, F.gelu),
    "swiglu": FFNChoice(GatedFeedForward, F.silu),
    "geglu": FFNChoice(GatedFeedForward, F.gelu),
    "moe": FFNChoice(MixtureOfExperts, None),  # experts: FFNS[model.ffn.expert]
}

__all__ = ["FFNS", "FFNChoice", "FeedForward", "GatedFeedForward", "glu_hidden_size"]
