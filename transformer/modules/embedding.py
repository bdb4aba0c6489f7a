"""Token embedding with optional sqrt(d_model) scaling, absolute positions and dropout."""

from __future__ import annotations

from torch import Tensor, nn

from transformer.modules.dropout import Dropout
from transformer.modules.positions import PositionEncoding


class TokenEmbedding(nn.Module):
    """``dropout(scale * E[tokens] + P(positions))`` (Vaswani et al. 2017, §3.4 and §5.4).

    Args:
        embedding: the token table ``(vocab, d_model)`` (possibly shared with other embeddings or
            the output projection).
        position: the position encoding; only :meth:`PositionEncoding.embed` is used here.
        scale: multiplier of the token vectors (``sqrt(d_model)`` in the paper, 1 otherwise).
        dropout: dropout on the sum.
    """

    def __init__(
        self, *, embedding: nn.Embedding, position: PositionEncoding, scale: float = 1.0, dropout: float = 0.0
    ):
        super().__init__()
        self.embedding, self.position, self.scale = embedding, position, scale
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Args: tokens, positions ``(batch, seq_len)`` long. Returns ``(batch, seq_len, d_model)``."""
        x = self.embedding(tokens)
        if self.scale != 1.0:
            x = x * self.scale
        pe = self.position.embed(positions)
        if pe is not None:
            x = x + pe.to(x.dtype)
        return self.dropout(x)
