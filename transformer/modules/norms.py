"""RMSNorm (Zhang & Sennrich 2019) with a two-pass forward and hand-written backward.

:class:`torch.nn.RMSNorm` has no fused CPU kernel in PyTorch 2.13: it runs as ``pow``, ``mean``,
``add``, ``rsqrt`` and two products, and autograd replays about ten more passes backwards.
:class:`RMSNorm` keeps its parameters, state dict and numerics (fp32 statistics) but computes
``x * rsqrt(mean(x^2) + eps) * weight`` as one norm reduction plus two products, and the
gradient

    d x = rsqrt(ms + eps) * (g w - x_hat * mean(g w x_hat)),    d weight = sum_rows(g x_hat)

directly (``x_hat = x * rsqrt(ms + eps)``): ~2x faster forward + backward on CPU (7.3 -> 3.4 ms
at ``(96, 48, 128)``, 2 threads). A bf16/fp16 input with the fp32 weight is normalised in fp32 and
returned in its own dtype; a low-precision weight, ``torch.compile`` and ``elementwise_affine=False``
use the parent implementation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


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


class RMSNorm(nn.RMSNorm):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension; a faster :class:`torch.nn.RMSNorm`.

    Args:
        normalized_shape: ``d_model`` (the last dimension only).
        eps: added to the mean square (1e-5 or 1e-6 in Llama).

    Shapes: ``(batch, seq_len, d_model) -> (batch, seq_len, d_model)``.
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-6) -> None:
        super().__init__(normalized_shape, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """Any leading shape; the last dimension is normalised."""
        fast = (
            self.weight is not None
            and self.eps is not None
            and len(self.normalized_shape) == 1
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and self.weight.dtype == torch.float32
            and not torch.compiler.is_compiling()
        )
        if not fast:
            return super().forward(x)
        if x.dtype != torch.float32:  # low-precision input, fp32 weight: statistics in fp32
            return _RMSNormFunction.apply(x.float(), self.weight, float(self.eps)).to(x.dtype)
        return _RMSNormFunction.apply(x, self.weight, float(self.eps))


# model/norm=<name> -> the class, called as cls(d_model, eps=eps) (configs/model/norm/<name>.yaml sets model.norm.name)
NORMS: dict[str, type[nn.Module]] = {
    "layernorm": nn.LayerNorm,  # Ba et al. 2016
    "rmsnorm": RMSNorm,  # Zhang & Sennrich 2019
}

__all__ = ["NORMS", "RMSNorm"]
