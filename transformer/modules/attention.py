"""Multi-head attention with grouped key/value heads, optional QK-norm and a KV cache: MHA, GQA
(Ainslie et al. 2023) and MQA (Shazeer 2019) through SDPA, for self- and cross-attention. Latent
attention is :mod:`transformer.modules.mla`; the cache and masks are in
:mod:`transformer.modules.attention_core`. :data:`ATTENTION_KINDS` is the ``model/attention`` switch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from transformer.kernels.rotary import apply_rotary
from transformer.modules.attention_core import KVCache, align_mask, sdpa
from transformer.modules.mla import MultiHeadLatentAttention

__all__ = ["ATTENTION_KINDS", "Attention", "AttentionKind"]


def _kv_heads_mha(n_heads: int, n_kv_heads: int | None) -> int:
    if n_kv_heads not in (None, n_heads):
        raise ValueError(
            f"needs n_kv_heads == n_heads ({n_heads}) or null, got n_kv_heads={n_kv_heads}; use gqa for "
            "fewer key/value heads"
        )
    return n_heads


def _kv_heads_gqa(n_heads: int, n_kv_heads: int | None) -> int:
    if n_kv_heads is None:
        raise ValueError("needs n_kv_heads (an integer dividing n_heads)")
    return int(n_kv_heads)


def _kv_heads_mqa(n_heads: int, n_kv_heads: int | None) -> int:
    if n_kv_heads not in (None, 1):
        raise ValueError(f"needs n_kv_heads=1 or null, got n_kv_heads={n_kv_heads}")
    return 1


def _kv_heads_mla(n_heads: int, n_kv_heads: int | None) -> int:
    if n_kv_heads is not None:
        raise ValueError(
            f"needs n_kv_heads=null, got n_kv_heads={n_kv_heads}: every head's keys and values are expanded "
            "from one latent (model.kv_lora_rank)"
        )
    return n_heads


@dataclass(frozen=True)
class AttentionKind:
    """One ``model/attention`` option.

    Attributes:
        kv_heads: ``(n_heads, n_kv_heads or None) -> key/value heads``, raising ``ValueError`` when
            they do not fit (MLA: the heads its latent expands to).
        self_attention: the self-attention class (a plugin's is built by its ``from_sizes``).
        cache_values, cost: a plugin's size functions (:func:`transformer.registry.register_attention`);
            None: unknown.
    """

    kv_heads: Callable[[int, int | None], int]
    self_attention: type[nn.Module]
    cache_values: Callable[[int, int, int, Any], int] | None = None
    cost: Callable[[int, int, int, int, Any], tuple[int, int, int]] | None = None

    @property
    def builtin(self) -> bool:
        """Whether the class is one of ours (its sizes, cache and FLOPs are known to the zoo)."""
        return self.self_attention in (Attention, MultiHeadLatentAttention)

    @property
    def latent(self) -> bool:
        """Whether self-attention caches a latent (MLA) rather than keys and values."""
        return issubclass(self.self_attention, MultiHeadLatentAttention)


class Attention(nn.Module):
    """Scaled dot-product attention over ``n_heads`` query and ``n_kv_heads`` key/value heads.

    Query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``. ``q_norm`` / ``k_norm``
    normalise each head over ``head_dim`` before RoPE (QK-norm, as Qwen3 and OLMo 2).

    Args:
        in_proj: Linear ``d_model -> (n_heads + 2 * n_kv_heads) * head_dim``, q, k and v stacked.
        out_proj: Linear ``n_heads * head_dim -> d_model``.
        dropout: on the attention weights (training only).

    Raises:
        ValueError: the sizes do not fit.
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
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if n_kv_heads <= 0 or n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if in_proj.out_features != (n_heads + 2 * n_kv_heads) * head_dim:
            raise ValueError(
                f"in_proj has {in_proj.out_features} outputs, expected "
                f"(n_heads + 2 * n_kv_heads) * head_dim = {(n_heads + 2 * n_kv_heads) * head_dim}"
            )
        if (q_norm is None) != (k_norm is None):
            raise ValueError("QK-norm needs both q_norm and k_norm (or neither)")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.in_proj, self.out_proj = in_proj, out_proj
        self.dropout = dropout
        if q_norm is not None:  # registered only when present: checkpoints without QK-norm keep their keys
            self.q_norm, self.k_norm = q_norm, k_norm
        else:
            self.q_norm = self.k_norm = None

    def _kv_heads(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(B, T, Hkv * hd)`` keys and values -> ``(B, Hkv, T, hd)`` (keys QK-normed)."""
        k = rearrange(k, "b t (h d) -> b h t d", h=self.n_kv_heads)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return k, rearrange(v, "b t (h d) -> b h t d", h=self.n_kv_heads)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend from ``x`` ``(batch, q_len, d_model)`` to itself or to ``memory``; ``(batch, q_len, d_model)``.

        Args:
            memory: ``(batch, k_len, d_model)`` for cross-attention, or ``(batch / g, k_len, d_model)``
                shared by ``g`` consecutive rows of ``x`` (the beams of a sentence).
            attn_mask: over cached plus new keys (:func:`~transformer.modules.attention_core.build_attention_mask`).
            is_causal: bottom-right aligned causal mask (only without ``attn_mask``).
            rotary: RoPE ``(cos, sin)`` of the new positions, applied to q and the new k.
            cache: self-attention appends to it; a static cache is filled once from ``memory``.
        """
        q_width = self.n_heads * self.head_dim
        w, b = self.in_proj.weight, self.in_proj.bias
        cross = memory is not None or (cache is not None and cache.static)
        if not cross:
            kv_width = self.n_kv_heads * self.head_dim
            # one split (its backward is one concatenation, not a zero-filled buffer per slice)
            q, k, v = self.in_proj(x).split((q_width, kv_width, kv_width), dim=-1)  # (B, T, H*hd), 2x (B, T, Hkv*hd)
            k, v = self._kv_heads(k, v)
        else:
            q = F.linear(x, w[:q_width], None if b is None else b[:q_width])
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                kv = F.linear(memory, w[q_width:], None if b is None else b[q_width:])
                k, v = self._kv_heads(*kv.chunk(2, dim=-1))
                if cache is not None:
                    cache.k, cache.v = k, v
        if cross and k.shape[0] != q.shape[0]:  # g consecutive query rows share one memory row
            g, t = q.shape[0] // k.shape[0], q.shape[1]
            q = rearrange(q, "(n g) t (h d) -> n h (g t) d", g=g, h=self.n_heads)  # (B/g, H, g*Tq, hd)
            if self.q_norm is not None:
                q = self.q_norm(q)
            out = sdpa(
                q, k, v, attn_mask, self.dropout if self.training else 0.0, False, self.n_kv_heads != self.n_heads
            )
            return self.out_proj(rearrange(out, "n h (g t) d -> (n g) t (h d)", g=g, t=t))
        q = rearrange(q, "b t (h d) -> b h t d", h=self.n_heads)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if rotary is not None:
            cos, sin = rotary
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        if not cross and cache is not None:
            k, v = cache.extend(k, v)
        attn_mask, causal = align_mask(attn_mask, is_causal, q.shape[2], k.shape[2], q.device)
        out = sdpa(
            q,
            k,
            v,
            attn_mask,
            self.dropout if self.training else 0.0,
            causal,
            self.n_kv_heads != self.n_heads,
        )  # (B, H, Tq, hd)
        return self.out_proj(rearrange(out, "b h t d -> b t (h d)"))


# model/attention=<kind> -> its AttentionKind: the key/value heads of every Attention from
# (n_heads, n_kv_heads or None), raising ValueError when the two do not fit the kind, and the
# self-attention class the builder wires
ATTENTION_KINDS: dict[str, AttentionKind] = {
    "mha": AttentionKind(_kv_heads_mha, Attention),  # one key/value head per query head (Vaswani et al. 2017)
    "gqa": AttentionKind(_kv_heads_gqa, Attention),  # n_kv_heads groups (Ainslie et al. 2023)
    "mqa": AttentionKind(_kv_heads_mqa, Attention),  # one key/value head (Shazeer 2019)
    "mla": AttentionKind(_kv_heads_mla, MultiHeadLatentAttention),  # latent KV, shared RoPE key (DeepSeek-V2)
}
