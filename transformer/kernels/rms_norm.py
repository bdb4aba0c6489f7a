"""RMSNorm (Zhang & Sennrich 2019) with a two-pass forward and a hand-written backward
(docs/design.md#hand-written-backward-passes-rmsnorm-and-rope)."""

from __future__ import annotations

import torch
from torch import Tensor


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        d = x.shape[-1]
        rstd = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(d).add_(eps).rsqrt_()
        ctx.save_for_backward(x, weight, rstd)
        return (x * rstd).mul_(weight)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        x_hat = x * rstd
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad * x_hat).reshape(-1, x.shape[-1]).sum(0)
        if ctx.needs_input_grad[0]:
            gw = grad * weight
            dot = torch.linalg.vecdot(gw, x_hat).unsqueeze(-1)  # (..., 1)
            grad_x = torch.addcmul(gw, x_hat, dot, value=-1.0 / x.shape[-1]).mul_(rstd)
        return grad_x, grad_w, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension: ``x`` ``(..., d_model)``, weight
    ``(d_model,)`` fp32; a bf16/fp16 ``x`` is normalised in fp32 and returned in its own dtype."""
    if x.dtype != torch.float32:  # low-precision input, fp32 weight: statistics in fp32
        return _RMSNormFunction.apply(x.float(), weight, float(eps)).to(x.dtype)
    return _RMSNormFunction.apply(x, weight, float(eps))


__all__ = ["rms_norm"]
