"""RMSNorm (Zhang & Sennrich 2019) with a two-pass forward and hand-written backward.

:class:`torch.nn.RMSNorm` has no fused CPU kernel in PyTorch 2.13: it runs as ``pow``, ``mean``,
``add``, ``rsqrt`` and two products, and autograd replays about ten more passes backwards.
:func:`rms_norm` (behind :class:`transformer.modules.norms.RMSNorm`, which keeps
:class:`torch.nn.RMSNorm`'s parameters, state dict and numerics: fp32 statistics) computes
``x * rsqrt(mean(x^2) + eps) * weight`` as one norm reduction plus two products, and the
gradient

    d x = rsqrt(ms + eps) * (g w - x_hat * mean(g w x_hat)),    d weight = sum_rows(g x_hat)

directly (``x_hat = x * rsqrt(ms + eps)``), with fewer passes over the tensor than autograd's graph
of the formula (measured in ``docs/benchmarks/cpu_choices.md``). A bf16/fp16 input with the fp32 weight is normalised in fp32 and
returned in its own dtype (the module uses :class:`torch.nn.RMSNorm`'s own forward for a
low-precision weight, under ``torch.compile`` and without ``elementwise_affine``).
"""

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
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension, with the hand-written backward.

    Args:
        x: ``(..., d_model)``, fp32, bf16 or fp16; a low-precision input is normalised in fp32 and
            returned in its own dtype.
        weight: ``(d_model,)`` fp32.
        eps: added to the mean square.

    Returns:
        Tensor of ``x``'s shape and dtype.
    """
    if x.dtype != torch.float32:  # low-precision input, fp32 weight: statistics in fp32
        return _RMSNormFunction.apply(x.float(), weight, float(eps)).to(x.dtype)
    return _RMSNormFunction.apply(x, weight, float(eps))


__all__ = ["rms_norm"]
