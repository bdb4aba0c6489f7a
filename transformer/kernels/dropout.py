"""Dropout (Srivastava et al. 2014) with a faster mask on the CPU, and dropout fused with a residual
add (docs/design.md#dropouts-mask-on-the-cpu). Elsewhere, and under ``torch.compile``, the
framework's dropout runs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_RANGE = 2**31  # int32 ``random_()`` draws from [0, 2^31 - 1]


def check_probability(p: float) -> None:
    """Raise ValueError unless ``0 <= p < 1``."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")


def _keep_mask(x: Tensor, p: float) -> Tensor:
    """``(x.shape)`` tensor of ``x.dtype``: ``1 / (1 - p)`` where kept (probability ``1 - p``), else 0."""
    draws = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    return (draws >= round(p * _RANGE)).to(x.dtype).mul_(1.0 / (1.0 - p))


class _MaskedScale(torch.autograd.Function):
    """``x * mask`` (and optionally ``+ residual``) whose backward reuses the saved mask."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, residual: Tensor | None) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.has_residual = residual is not None
        return x * mask if residual is None else torch.addcmul(residual, x, mask)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None]:
        (mask,) = ctx.saved_tensors
        grad_x = (grad * mask).to(mask.dtype) if ctx.needs_input_grad[0] else None
        grad_res = grad if ctx.has_residual and ctx.needs_input_grad[2] else None
        return grad_x, None, grad_res


def _use_fast_path(x: Tensor, residual: Tensor | None = None) -> bool:
    # a low-precision sublayer output may meet an fp32 residual (autocast): addcmul promotes; under
    # torch.compile the framework's dropout, which traces (an in-place random_ is a graph break)
    return (
        x.device.type == "cpu"
        and x.is_floating_point()
        and (residual is None or residual.is_floating_point())
        and not torch.compiler.is_compiling()
    )


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by ``1 / (1 - p)``;
    identity unless ``training``.

    Raises:
        ValueError: ``p`` outside ``[0, 1)``.
    """
    check_probability(p)
    if not training or p == 0.0:
        return x
    if not _use_fast_path(x):
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, _keep_mask(x, p), None)


def dropout_add(residual: Tensor, x: Tensor, p: float, training: bool) -> Tensor:
    """``residual + dropout(x, p)``, both ``(batch, seq_len, d_model)``: the residual connection of
    Vaswani et al. 2017 §5.4, summed in the residual's dtype.

    Raises:
        ValueError: ``p`` outside ``[0, 1)``.
    """
    check_probability(p)
    if not training or p == 0.0:
        return residual + x
    if not _use_fast_path(x, residual):
        return residual + F.dropout(x, p, True)
    return _MaskedScale.apply(x, _keep_mask(x, p), residual)


__all__ = ["check_probability", "dropout", "dropout_add"]
