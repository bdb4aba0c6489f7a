"""Residual wrappers that place the normalisation: post-LN (the 2017 paper) or pre-LN.

Swapping the wrapper, not a flag inside the layer, selects ``model.norm_position``
(:data:`RESIDUALS`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from transformer.kernels.dropout import dropout_add


class PostNormResidual(nn.Module):
    """``norm(x + dropout(sublayer(x)))`` (Vaswani et al. 2017 §5.4)."""

    final_norm: ClassVar[bool] = False  # the output of a post-norm stack is already normalised

    def __init__(self, *, sublayer: nn.Module, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.sublayer, self.norm, self.dropout = sublayer, norm, float(dropout)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """``(batch, seq_len, d_model) -> (batch, seq_len, d_model)``; extra arguments go to the sublayer."""
        return self.norm(dropout_add(x, self.sublayer(x, *args, **kwargs), self.dropout, self.training))


class PreNormResidual(nn.Module):
    """``x + dropout(sublayer(norm(x)))`` (Xiong et al. 2020); the stack then ends with a final norm."""

    final_norm: ClassVar[bool] = True  # a pre-norm stack ends with one more norm

    def __init__(self, *, sublayer: nn.Module, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.sublayer, self.norm, self.dropout = sublayer, norm, float(dropout)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """``(batch, seq_len, d_model) -> (batch, seq_len, d_model)``; extra arguments go to the sublayer."""
        return dropout_add(x, self.sublayer(self.norm(x), *args, **kwargs), self.dropout, self.training)


# model.norm_position=<name> -> the residual wrapper of every sublayer
RESIDUALS: dict[str, type[PostNormResidual] | type[PreNormResidual]] = {
    "post": PostNormResidual,
    "pre": PreNormResidual,
}

__all__ = ["RESIDUALS", "PostNormResidual", "PreNormResidual"]
