"""The dropout module (Srivastava et al. 2014) over the faster CPU kernel of
:mod:`transformer.kernels.dropout`."""

from __future__ import annotations

from torch import Tensor, nn

from transformer.kernels.dropout import check_probability, dropout


class Dropout(nn.Module):
    """Drop-in replacement of :class:`torch.nn.Dropout` using :func:`dropout` (faster CPU mask).

    Args:
        p: drop probability in ``[0, 1)``.

    Raises:
        ValueError: if ``p`` is outside ``[0, 1)``.
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        check_probability(p)
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        """Any shape; identity in eval mode."""
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


__all__ = ["Dropout"]
