"""Differential attention (Ye et al. 2024, "Differential Transformer", §2.1), as a plugin.

Each head splits its queries and keys into two halves, computes two softmax attention maps and
subtracts the second, scaled by a learned λ, from the first, cancelling attention noise that both
maps share (eq. 1): ``DiffAttn(X) = (softmax(Q1 K1ᵀ / √d) − λ softmax(Q2 K2ᵀ / √d)) V`` with
``λ = exp(λq1 · λk1) − exp(λq2 · λk2) + λ_init`` (eq. 2). Each head's output is normalised
(RMSNorm over the head, the paper's GroupNorm) and multiplied by ``1 − λ_init`` (eq. 3).

Differences from the paper, at the zoo's interface: the projections keep the zoo's head count
(``n_heads`` heads of ``head_dim``, each split into two halves of ``head_dim / 2``, where the paper
halves the number of heads to keep its parameter count, which is the same here); ``λ_init`` is
the option's field ``model.attention.lambda_init`` (default 0.8) for every layer instead of the
paper's depth schedule ``0.8 − 0.6 exp(−0.3 (l − 1))``, since a layer does not know its depth; and
each half holds whole RoPE rotation pairs, so each half's scores depend on relative positions only.

    python scripts/train.py plugins=[examples/plugins/diff_attention] model=llama_style_tiny model/attention=diff
    python scripts/train.py plugins=[examples/plugins/diff_attention] experiment=branches ladder=step5_diff seed=1
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from transformer.config import AttentionConfig
from transformer.kernels.rotary import apply_rotary
from transformer.modules.attention_core import KVCache, align_mask, sdpa
from transformer.modules.norms import RMSNorm
from transformer.registry import register_attention


@dataclass
class DiffAttentionConfig(AttentionConfig):
    """``model/attention=diff``: the fields every attention has, and λ's initial value."""

    name: str = "diff"
    lambda_init: float = 0.8  # λ_init of eq. 2 (the paper: 0.8 - 0.6 exp(-0.3 (l - 1)) at layer l)

    def validate(self) -> None:
        """Called with the option's node before anything is built (``transformer.config.validate_option_fields``)."""
        if not 0.0 <= self.lambda_init < 1.0:
            raise ValueError(
                f"model.attention.lambda_init={self.lambda_init} must be in [0, 1) (the paper's "
                "schedule gives 0.2 to 0.8)"
            )


def _halves(x: Tensor) -> tuple[Tensor, Tensor]:
    """Split ``(..., head_dim)`` into two ``(..., head_dim / 2)`` halves that each hold whole RoPE
    rotation pairs (dimension ``i`` rotates with ``i + head_dim / 2``), half-split layout kept."""
    first, second = x.chunk(2, dim=-1)  # (..., hd/2) each: the two members of every rotation pair
    a1, b1 = first.chunk(2, dim=-1)
    a2, b2 = second.chunk(2, dim=-1)
    return torch.cat([a1, a2], dim=-1), torch.cat([b1, b2], dim=-1)


def _cost(d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, config: Any) -> tuple[int, int, int]:
    """Projection weights (q, k, v, out), query/key width and value width: the scores of the two
    half-width maps cost one full-width map; the weighted sum runs twice."""
    kv = n_kv_heads * head_dim
    return d_model * (d_model + 2 * kv) + d_model * d_model, n_heads * head_dim, 2 * n_heads * head_dim


@register_attention(
    "diff",
    config=DiffAttentionConfig,
    cost=_cost,
    cache_values=lambda n_heads, n_kv_heads, head_dim, config: 2 * n_kv_heads * head_dim,
)
class DifferentialAttention(nn.Module):
    """Differential self-attention over ``n_heads`` query and ``n_kv_heads`` key/value heads.

    Args:
        n_heads, n_kv_heads, head_dim: heads (``n_kv_heads`` divides ``n_heads``) and their width
            (even, split in two halves of whole rotation pairs: a multiple of 4).
        in_proj: Linear ``d_model -> (n_heads + 2 n_kv_heads) head_dim`` (q, k, v stacked).
        out_proj: Linear ``n_heads head_dim -> d_model``.
        dropout: on the attention weights (training only).
        lambda_init: λ_init (eq. 2), also the output scale ``1 - lambda_init`` (eq. 3).
        q_norm, k_norm: QK-norm over each head (``model.qk_norm``), or None.

    Raises:
        ValueError: sizes that do not fit.
    """

    def __init__(
        self,
        *,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        in_proj: nn.Linear,
        out_proj: nn.Linear,
        dropout: float = 0.0,
        lambda_init: float = 0.8,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if n_kv_heads <= 0 or n_heads % n_kv_heads or head_dim % 4:
            raise ValueError(
                f"differential attention needs n_kv_heads dividing n_heads and head_dim a multiple of 4, "
                f"got {n_heads}, {n_kv_heads}, {head_dim}"
            )
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.in_proj, self.out_proj, self.dropout = in_proj, out_proj, dropout
        self.lambda_init = float(lambda_init)
        half = head_dim // 2
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(half) * 0.1) for _ in range(4)
        )  # N(0, 0.1), the authors' code
        self.head_norm = RMSNorm(head_dim, eps=1e-5)
        self.q_norm, self.k_norm = q_norm, k_norm

    @classmethod
    def from_sizes(
        cls,
        *,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        bias: bool,
        dropout: float,
        qk_norm: Callable[[int], nn.Module] | None,
        config: Any,
    ) -> DifferentialAttention:
        """The module from the zoo's sizes (``transformer.registry.register_attention``'s contract)."""
        norms = {} if qk_norm is None else {"q_norm": qk_norm(head_dim), "k_norm": qk_norm(head_dim)}
        return cls(
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            in_proj=nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias),
            out_proj=nn.Linear(n_heads * head_dim, d_model, bias=bias),
            dropout=dropout,
            lambda_init=config.lambda_init,
            **norms,
        )

    def lam(self) -> Tensor:
        """λ of eq. 2 (a scalar tensor)."""
        return (
            torch.exp((self.lambda_q1 * self.lambda_k1).sum())
            - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
            + self.lambda_init
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Self-attention of ``x`` ``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``
        (the arguments of :class:`~transformer.modules.attention.Attention`; ``memory`` must be None).

        Raises:
            ValueError: ``memory`` given (the zoo builds cross-attention as multi-head attention).
        """
        if memory is not None:
            raise ValueError("differential attention is a self-attention (cross-attention stays multi-head attention)")
        kv_width = self.n_kv_heads * self.head_dim
        q, k, v = self.in_proj(x).split((self.n_heads * self.head_dim, kv_width, kv_width), dim=-1)
        q = rearrange(q, "b t (h d) -> b h t d", h=self.n_heads)
        k = rearrange(k, "b t (h d) -> b h t d", h=self.n_kv_heads)
        v = rearrange(v, "b t (h d) -> b h t d", h=self.n_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if cache is not None:
            k, v = cache.extend(k, v)
        mask, causal = align_mask(attn_mask, is_causal, q.shape[2], k.shape[2], q.device)
        (q1, q2), (k1, k2) = _halves(q), _halves(k)
        p, gqa = self.dropout if self.training else 0.0, self.n_kv_heads != self.n_heads
        out = sdpa(q1, k1, v, mask, p, causal, gqa) - self.lam().to(q.dtype) * sdpa(q2, k2, v, mask, p, causal, gqa)
        out = self.head_norm(out) * (1.0 - self.lambda_init)  # (B, H, T, hd)
        return self.out_proj(rearrange(out, "b h t d -> b t (h d)"))
