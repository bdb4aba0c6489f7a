"""ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears", §2.3), as a plugin: a norm with a
field of its own.

``ScaleNorm(x) = g * x / max(||x||, eps)`` over the last dimension, with one learned scalar ``g``
per norm in place of LayerNorm's ``width`` gains and biases. The paper initialises ``g`` to
``sqrt(width)``; the option's field ``model.norm.scale_init`` sets another start (null keeps
``sqrt(width)``). The norm is built by ``from_sizes(*, width, eps, config)``, ``config`` being the
``model.norm`` node (``model.qk_norm=scalenorm`` builds its per-head norms with the same node when
``model/norm=scalenorm``, else with the defaults).

    python scripts/train.py plugins=[examples/plugins/scalenorm] model/norm=scalenorm model.norm.scale_init=4.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from transformer.config import NormConfig
from transformer.registry import register_norm


@dataclass
class ScaleNormConfig(NormConfig):
    """``model/norm=scalenorm``: the fields every norm has (``eps``), and the gain's first value."""

    name: str = "scalenorm"
    scale_init: float | None = None  # g at initialisation; null: sqrt(width), the paper's

    def validate(self) -> None:
        """Called with the option's node before anything is built."""
        if self.scale_init is not None and not self.scale_init > 0:
            raise ValueError(f"model.norm.scale_init={self.scale_init} must be > 0 (or null: sqrt of the width)")


@register_norm("scalenorm", config=ScaleNormConfig)
class ScaleNorm(nn.Module):
    """``g * x / max(||x||_2, eps)`` over the last dimension, ``g`` one learned scalar.

    Args:
        width: the last dimension.
        eps: the smallest norm divided by.
        scale_init: ``g``'s first value (None: ``sqrt(width)``).

    Shapes: ``(..., width) -> (..., width)``.
    """

    def __init__(self, width: int, eps: float = 1e-5, scale_init: float | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.tensor(math.sqrt(width) if scale_init is None else float(scale_init)))

    @classmethod
    def from_sizes(cls, *, width: int, eps: float, config: Any) -> ScaleNorm:
        """The contract of ``transformer.registry``: ``config`` is the ``model.norm`` node."""
        return cls(width, eps=eps, scale_init=config.scale_init)

    def forward(self, x: Tensor) -> Tensor:
        norm = x.float().norm(dim=-1, keepdim=True).clamp_min(self.eps)  # (..., 1), fp32
        return (x.float() * (self.scale / norm)).to(x.dtype)
