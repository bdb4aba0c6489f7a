"""Multi-head attention with grouped key/value heads and a KV cache.

One module serves self-attention and cross-attention, MHA (``n_kv_heads == n_heads``), GQA
(Ainslie et al. 2023; ``n_kv_heads`` divides ``n_heads``) and MQA (Shazeer 2019; ``n_kv_heads == 1``).
The kernel is :func:`torch.nn.functional.scaled_dot_product_attention`.

:data:`ATTENTION_KINDS` is the ``model/attention`` switch: option name -> the rule that gives the
number of key/value heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from transformer.kernels.rotary import apply_rotary
from transformer.modules.positions import PositionEncoding


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


# model/attention=<kind> -> (n_heads, n_kv_heads or None) -> key/value heads of every Attention;
# the rule raises ValueError when the two do not fit the kind
ATTENTION_KINDS: dict[str, Callable[[int, int | None], int]] = {
    "mha": _kv_heads_mha,  # one key/value head per query head (Vaswani et al. 2017)
    "gqa": _kv_heads_gqa,  # n_kv_heads groups (Ainslie et al. 2023)
    "mqa": _kv_heads_mqa,  # one key/value head (Shazeer 2019)
}


class KVCache:
    """Keys and values of one attention module during incremental decoding.

    Self-attention caches grow by one step per call; cross-attention caches are filled once per
    source and reused. ``k`` and ``v`` are ``(batch, n_kv_heads, cached_len, head_dim)``.

    Args:
        static: True for cross-attention (filled once from the encoder output, then only read).
    """

    __slots__ = ("k", "v", "static")

    def __init__(self, *, static: bool = False) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.static = static

    def reorder(self, index: Tensor) -> None:
        """Select (and repeat) batch rows, e.g. to follow the surviving beams.

        Args:
            index: ``(new_batch,)`` long tensor of rows to keep.
        """
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


def build_attention_mask(
    key_padding_mask: Tensor | None,
    causal: bool,
    q_len: int,
    k_len: int,
    score_bias: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Tensor | None, bool]:
    """Combine padding, causality and an additive score bias into SDPA arguments.

    Queries are the last ``q_len`` of ``k_len`` positions (so a causal mask is bottom-right aligned,
    which is what a KV cache needs: one or several new queries over cached keys, as in chunked
    prefill or speculative decoding).

    Args:
        key_padding_mask: ``(batch, k_len)`` bool, True at padding keys, or None.
        causal: forbid attending to later positions.
        q_len, k_len: query and key lengths.
        score_bias: ``(batch | 1, n_heads, q_len, k_len)`` additive bias (ALiBi), or None.
        dtype: dtype of a float mask (the attention dtype).
        device: where a mask built from causality alone goes (default: the device of
            ``key_padding_mask`` or ``score_bias``, else the CPU).

    Returns:
        ``(attn_mask, is_causal)`` for SDPA: None + True for the plain causal case, a bool mask
        ``(batch, 1, q_len, k_len)`` (True = attend) without a bias, a float mask with a bias.
    """
    if key_padding_mask is None and score_bias is None:
        if not causal or q_len == 1:
            return None, False
        if q_len == k_len:
            return None, True
    allowed: Tensor | None = None
    if causal and q_len > 1:
        if key_padding_mask is not None:
            device = key_padding_mask.device
        elif score_bias is not None:
            device = score_bias.device
        q_idx = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        allowed = (torch.arange(k_len, device=device)[None, :] <= q_idx)[None, None]  # (1,1,Tq,Tk)
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B,1,1,Tk)
        allowed = keep if allowed is None else allowed & keep
    if score_bias is None:
        return allowed, False
    bias = score_bias.to(dtype)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias, False


@dataclass(frozen=True)
class AttentionInputs:
    """The self-attention arguments every layer of a stack shares, prepared once per forward pass
    (:meth:`prepare`) and passed down the stack as one object.

    Attributes:
        mask: the SDPA mask from :func:`build_attention_mask` (bool ``(batch, 1, q_len, k_len)``,
            True = attend, or a float mask ``(batch | 1, n_heads, q_len, k_len)`` carrying a score
            bias), or None.
        is_causal: SDPA's causal flag (set only without ``mask``).
        rotary: RoPE ``(cos, sin)``, each ``(batch | 1, 1, q_len, head_dim)`` fp32, or None.
    """

    mask: Tensor | None = None
    is_causal: bool = False
    rotary: tuple[Tensor, Tensor] | None = None

    @classmethod
    def prepare(
        cls,
        position: PositionEncoding,
        q_positions: Tensor,
        k_positions: Tensor | None = None,
        *,
        causal: bool,
        key_padding_mask: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> AttentionInputs:
        """Positions -> score bias -> mask -> rotary tables, the one sequence every stack runs.

        Args:
            position: the stack's position encoding (its :meth:`~PositionEncoding.score_bias` and
                :meth:`~PositionEncoding.rotary`; absolute encodings contribute nothing here).
            q_positions: ``(batch | 1, q_len)`` positions of the queries.
            k_positions: ``(batch | 1, k_len)`` positions of the keys (cached plus new); default
                ``q_positions``.
            causal: forbid attending to later positions (decoders).
            key_padding_mask: ``(batch, k_len)`` bool, True at padding keys, or None.
            dtype: dtype of a float mask (the activations' dtype).
        """
        k_positions = q_positions if k_positions is None else k_positions
        bias = position.score_bias(q_positions, k_positions, causal=causal)
        mask, is_causal = build_attention_mask(
            key_padding_mask, causal, q_positions.shape[1], k_positions.shape[1], bias, dtype
        )
        return cls(mask=mask, is_causal=is_causal, rotary=position.rotary(q_positions))


class Attention(nn.Module):
    """Scaled dot-product attention over ``n_heads`` query and ``n_kv_heads`` key/value heads.

    Query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``.

    Args:
        n_heads: query heads.
        n_kv_heads: key/value heads; must divide ``n_heads``.
        head_dim: width of one head.
        in_proj: Linear ``d_model -> (n_heads + 2 * n_kv_heads) * head_dim`` holding the q, k and v
            projections stacked in that order (one matmul for self-attention, as in
            ``nn.MultiheadAttention``'s ``in_proj_weight``).
        out_proj: Linear ``n_heads * head_dim -> d_model``.
        dropout: dropout on the attention weights (training only).

    Raises:
        ValueError: if the sizes do not fit.
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
    ) -> None:
        super().__init__()
        if n_kv_heads <= 0 or n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if in_proj.out_features != (n_heads + 2 * n_kv_heads) * head_dim:
            raise ValueError(
                f"in_proj has {in_proj.out_features} outputs, expected "
                f"(n_heads + 2 * n_kv_heads) * head_dim = {(n_heads + 2 * n_kv_heads) * head_dim}"
            )
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.in_proj, self.out_proj = in_proj, out_proj
        self.dropout = dropout

    def _kv_heads(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(B, T, Hkv * hd)`` keys and values -> ``(B, Hkv, T, hd)``."""
        return (rearrange(k, "b t (h d) -> b h t d", h=self.n_kv_heads),
                rearrange(v, "b t (h d) -> b h t d", h=self.n_kv_heads))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend from ``x`` to itself (``memory is None``) or to ``memory``.

        Args:
            x: queries' input ``(batch, q_len, d_model)``.
            memory: keys'/values' input ``(batch, k_len, d_model)`` for cross-attention, or
                ``(batch / g, k_len, d_model)`` shared by ``g`` consecutive rows of ``x`` (beams of one
                sentence during decoding; the same holds for a static cache's rows).
            attn_mask: from :func:`build_attention_mask`, covering cached plus new keys (cross-attention:
                one row per memory row).
            is_causal: causal mask (only without ``attn_mask``), bottom-right aligned: with a KV
                cache the ``q_len`` new queries are the last positions of the cached plus new keys.
            rotary: ``(cos, sin)`` for the new positions (RoPE), applied to q and the new k.
            cache: a :class:`KVCache`; self-attention appends the new k/v; a static (cross-attention)
                cache is filled once from ``memory`` and reused afterwards, when ``memory`` may be None.

        Returns:
            ``(batch, q_len, d_model)``.
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
            out = _sdpa(q, k, v, attn_mask, self.dropout if self.training else 0.0, False,
                        self.n_kv_heads != self.n_heads)
            return self.out_proj(rearrange(out, "n h (g t) d -> (n g) t (h d)", g=g, t=t))
        q = rearrange(q, "b t (h d) -> b h t d", h=self.n_heads)
        if rotary is not None:
            cos, sin = rotary
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        if not cross and cache is not None:
            if cache.k is not None:
                k = torch.cat((cache.k, k), dim=2)
                v = torch.cat((cache.v, v), dim=2)
            cache.k, cache.v = k, v
        causal = is_causal and attn_mask is None
        if causal and k.shape[2] != q.shape[2]:  # new queries over a cache: SDPA aligns top-left
            attn_mask, causal = build_attention_mask(None, True, q.shape[2], k.shape[2], device=q.device)
        out = _sdpa(
            q, k, v, attn_mask, self.dropout if self.training else 0.0, causal,
            self.n_kv_heads != self.n_heads,
        )  # (B, H, Tq, hd)
        return self.out_proj(rearrange(out, "b h t d -> b t (h d)"))


def _sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool, enable_gqa: bool) -> Tensor:
    """:func:`F.scaled_dot_product_attention`, in fp32 on the CPU under bf16/fp16 autocast.

    On the CPU, SDPA's low-precision flash kernel is slow where Transformers for translation live
    (sentences of tens of tokens): in a bf16-autocast profile of the base model on an AMX Xeon its
    backward took 26.7 ms a call, 32% of the training step (issue #11). Attention is a small share
    of the FLOPs at these lengths, so it runs in fp32 there (the projections around it stay in
    bf16) and returns the autocast dtype. On CUDA, low-precision flash/efficient kernels are used.

    Shapes: q ``(batch, n_heads, q_len, head_dim)``, k/v ``(batch, n_kv_heads, k_len, head_dim)``
    -> ``(batch, n_heads, q_len, head_dim)``.
    """
    device = q.device.type
    if device == "cpu" and torch.is_autocast_enabled(device) and q.dtype in (torch.bfloat16, torch.float16):
        low = q.dtype
        with torch.autocast(device, enabled=False):
            out = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(),
                attn_mask=attn_mask.float() if attn_mask is not None and attn_mask.is_floating_point() else attn_mask,
                dropout_p=dropout_p, is_causal=is_causal,
                enable_gqa=enable_gqa,
            )
        return out.to(low)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa
    )
