"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2 §2.1).

Keys and values come from one low-rank latent per token, ``c_KV = norm(W_DKV h)``, expanded per
head; one decoupled rotated key ``k_R = RoPE(W_KR h)`` is shared by all heads (§2.1.3). The cache
holds ``kv_lora_rank + qk_rope_head_dim`` values per token and layer. Layout and names are Hugging
Face's ``DeepseekV3Attention`` (``rope_interleave=False``); docs/architectures.md#multi-head-latent-attention."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from transformer.kernels.rotary import apply_rotary
from transformer.modules.attention_core import KVCache, align_mask, sdpa

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(nn.Module):
    """Self-attention over a compressed key/value latent with a decoupled, shared RoPE key.

    Args:
        qk_nope_head_dim: per-head query/key width without position (may be 0).
        qk_rope_head_dim: per-head rotated query width = the shared rotated key's (0: no RoPE part).
        q_proj: ``d_model -> n_heads * (qk_nope_head_dim + qk_rope_head_dim)``, a Linear or a low-rank
            ``Sequential(Linear(d_model, q_lora_rank), norm, Linear(q_lora_rank, ...))``.
        kv_down: Linear ``d_model -> kv_lora_rank + qk_rope_head_dim`` (``W_DKV`` then ``W_KR``).
        kv_norm: RMSNorm over ``kv_lora_rank``.
        kv_up: Linear ``kv_lora_rank -> n_heads * (qk_nope_head_dim + v_head_dim)``, per head key rows
            then value rows.
        out_proj: Linear ``n_heads * v_head_dim -> d_model``.

    Raises:
        ValueError: the projections' sizes do not fit.
    """

    def __init__(
        self,
        *,
        n_heads: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_proj: nn.Module,
        kv_down: nn.Linear,
        kv_norm: nn.Module,
        kv_up: nn.Linear,
        out_proj: nn.Linear,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        qk = qk_nope_head_dim + qk_rope_head_dim
        last_q = q_proj[-1] if isinstance(q_proj, nn.Sequential) else q_proj
        if qk <= 0 or qk_rope_head_dim % 2 or kv_lora_rank <= 0 or v_head_dim <= 0:
            raise ValueError(
                f"MLA needs kv_lora_rank > 0, v_head_dim > 0, an even qk_rope_head_dim and qk_nope_head_dim + "
                f"qk_rope_head_dim > 0; got {kv_lora_rank}, {v_head_dim}, {qk_rope_head_dim}, {qk_nope_head_dim}"
            )
        checks = [
            ("q_proj outputs", last_q.out_features, n_heads * qk),
            ("kv_down outputs", kv_down.out_features, kv_lora_rank + qk_rope_head_dim),
            ("kv_up inputs", kv_up.in_features, kv_lora_rank),
            ("kv_up outputs", kv_up.out_features, n_heads * (qk_nope_head_dim + v_head_dim)),
            ("out_proj inputs", out_proj.in_features, n_heads * v_head_dim),
        ]
        for name, got, want in checks:
            if got != want:
                raise ValueError(
                    f"{name}: {got}, expected {want} (n_heads={n_heads}, kv_lora_rank={kv_lora_rank}, "
                    f"qk_nope_head_dim={qk_nope_head_dim}, qk_rope_head_dim={qk_rope_head_dim}, "
                    f"v_head_dim={v_head_dim})"
                )
        self.n_heads, self.kv_lora_rank = n_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.q_proj, self.kv_down, self.kv_norm, self.kv_up, self.out_proj = q_proj, kv_down, kv_norm, kv_up, out_proj
        self.dropout = dropout

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """:meth:`Attention.forward` for self-attention: ``(batch, q_len, d_model)`` -> the same; the cache
        gets the new latents (``k``) and rotated keys (``v``).

        Raises:
            ValueError: cross-attention (``memory`` or a static cache).
        """
        if memory is not None or (cache is not None and cache.static):
            raise ValueError("MultiHeadLatentAttention is self-attention only (cross-attention uses Attention)")
        nope, rope, h = self.qk_nope_head_dim, self.qk_rope_head_dim, self.n_heads
        q = rearrange(self.q_proj(x), "b t (h d) -> b h t d", h=h)  # (B, H, Tq, nope+rope)
        q_nope, q_rope = q.split((nope, rope), dim=-1)
        latent, k_rope = self.kv_down(x).split((self.kv_lora_rank, rope), dim=-1)  # (B, T, r), (B, T, rope)
        latent = self.kv_norm(latent)[:, None]  # (B, 1, T, r)
        k_rope = k_rope[:, None]  # (B, 1, T, rope): one rotated key shared by the heads
        if rotary is not None:
            cos, sin = rotary
            q_rope = apply_rotary(q_rope, cos, sin)
            k_rope = apply_rotary(k_rope, cos, sin)
        if cache is not None:
            latent, k_rope = cache.extend(latent, k_rope)  # only the latent and the shared key are kept
        kv = rearrange(self.kv_up(latent[:, 0]), "b t (h d) -> b h t d", h=h)  # (B, H, Tk, nope+v)
        k_nope, v = kv.split((nope, self.v_head_dim), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, h, -1, -1)), dim=-1)  # (B, H, Tk, nope+rope)
        q = torch.cat((q_nope, q_rope), dim=-1)
        attn_mask, causal = align_mask(attn_mask, is_causal, q.shape[2], k.shape[2], q.device)
        out = sdpa(q, k, v, attn_mask, self.dropout if self.training else 0.0, causal, False)  # (B, H, Tq, v)
        return self.out_proj(rearrange(out, "b h t d -> b t (h d)"))
