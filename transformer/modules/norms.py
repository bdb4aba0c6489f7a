"""RMSNorm (Zhang & Sennrich 2019): :class:`torch.nn.RMSNorm`'s parameters, state dict and numerics
over the faster kernel of :mod:`transformer.kernels.rms_norm` (one norm reduction plus two
products forward, a hand-written backward). A low-precision weight, ``torch.compile`` and
``elementwise_affine=False`` use the parent implementation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer.kernels.rms_norm import rms_norm


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
        return rms_norm(x, self.weight, self.eps)


# model/norm=<name> -> the class, called as cls(width, eps=eps) (configs/model/norm/<name>.yaml sets model.norm.name);
# a plugin's class with fields of its own is built by its from_sizes(*, width, eps, config) (models/builder.py)
NORMS: dict[str, type[nn.Module]] = {
    "layernorm": nn.LayerNorm,  # Ba et al. 2016
    "rmsnorm": RMSNorm,  # Zhang & Sennrich 2019
}

__all__ = ["NORMS", "RMSNorm"]
