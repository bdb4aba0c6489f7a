"""RoPE's rotation (Su et al. 2021) as one autograd function, the inverse rotation backward
(docs/design.md#hand-written-backward-passes-rmsnorm-and-rope)."""

from __future__ import annotations

import torch
from torch import Tensor


def _rotate_half_split(x: Tensor, c: Tensor, s: Tensor, sign: float) -> Tensor:
    """``[x1 c - sign x2 s, x2 c + sign x1 s]`` for the halves ``x1, x2`` of the last dimension."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    out = torch.empty(torch.broadcast_shapes(x.shape, c.shape[:-1] + (2 * h,)), dtype=x.dtype, device=x.device)
    o1, o2 = out[..., :h], out[..., h:]
    torch.mul(x1, c, out=o1)
    o1.addcmul_(x2, s, value=-sign)
    torch.mul(x2, c, out=o2)
    o2.addcmul_(x1, s, value=sign)
    return out


class _Rotary(torch.autograd.Function):
    """RoPE as one rotation forward and the rotation with the sine negated backward."""

    @staticmethod
    def forward(ctx, x: Tensor, cos_half: Tensor, sin_half: Tensor) -> Tensor:
        ctx.save_for_backward(cos_half, sin_half)
        return _rotate_half_split(x, cos_half, sin_half, 1.0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        cos_half, sin_half = ctx.saved_tensors
        return _rotate_half_split(grad, cos_half, sin_half, -1.0), None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin``, ``rotate_half([x1, x2]) = [-x2, x1]`` (half-split, GPT-NeoX /
    HF Llama), computed in fp32 and returned in ``x``'s dtype; :class:`_Rotary` in eager mode, the
    formula under ``torch.compile``.

    Args:
        x: ``(batch, n_heads, seq_len, head_dim)``.
        cos, sin: ``(batch, 1, seq_len, head_dim)`` fp32, both halves holding the same angles.
    """
    xf = x.float()
    if torch.compiler.is_compiling():
        x1, x2 = xf.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)
    h = cos.shape[-1] // 2
    return _Rotary.apply(xf, cos[..., :h], sin[..., :h]).to(x.dtype)


__all__ = ["apply_rotary"]
