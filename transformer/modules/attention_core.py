"""What every attention module shares: the KV cache, the mask builder, the per-stack
:class:`AttentionInputs` and the SDPA call; re-exported by :mod:`transformer.modules.attention`.
Why SDPA runs in fp32 on the CPU: docs/design.md#attention-on-the-cpu-and-fp32-gqa-on-a-gpu."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.modules.positions import PositionEncoding

__all__ = ["AttentionInputs", "KVCache", "align_mask", "build_attention_mask", "expand_kv_heads", "sdpa", "window_keep"]


class KVCache:
    """Keys and values of one attention module during incremental decoding.

    ``k`` and ``v`` are ``(batch, n_kv_heads, cached_len, head_dim)`` (multi-head latent attention: its
    latent ``(batch, 1, cached_len, kv_lora_rank)`` in ``k``, its rotated key in ``v``). A self-attention
    cache writes in place into buffers sized by :meth:`reserve` (doubling when full) and double-buffers
    reorders; a rolling buffer (``max_len``) keeps the newest entries; a static cache (cross-attention)
    is filled once and only read.

    Args:
        static: True for cross-attention.
        max_len: keep at most this many newest entries (a sliding window, Jiang et al. 2023 §2); None
            keeps all.
    """

    __slots__ = ("_k", "_v", "_spare", "_rows", "_len", "_want", "static", "max_len")

    def __init__(self, *, static: bool = False, max_len: int | None = None) -> None:
        self._k: Tensor | None = None  # (rows', heads, capacity, dim) with rows' >= rows, capacity >= len
        self._v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # the reorder's target buffers
        self._rows = 0  # rows in use
        self._len = 0  # entries in use
        self._want = 0  # the capacity :meth:`reserve` asked for
        self.static = static
        self.max_len = max_len

    @staticmethod
    def _filled(buffer: Tensor | None, rows: int, length: int) -> Tensor | None:
        if buffer is None or (buffer.shape[0] == rows and buffer.shape[2] == length):
            return buffer
        return buffer[:rows, :, :length]

    @property
    def k(self) -> Tensor | None:
        """The cached keys ``(batch, heads, cached_len, dim)`` (a view of the buffer), or None."""
        return self._filled(self._k, self._rows, self._len)

    @k.setter
    def k(self, value: Tensor | None) -> None:
        self._k, self._spare = value, None
        self._rows, self._len = (0, 0) if value is None else (value.shape[0], value.shape[2])

    @property
    def v(self) -> Tensor | None:
        """The cached values ``(batch, heads, cached_len, dim)`` (a view of the buffer), or None."""
        return self._filled(self._v, self._rows, self._len)

    @v.setter
    def v(self, value: Tensor | None) -> None:
        self._v, self._spare = value, None
        self._rows, self._len = (0, 0) if value is None else (value.shape[0], value.shape[2])

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more entries, so decoding allocates no buffer after the next write
        (nothing for a rolling or static cache)."""
        if not self.static and self.max_len is None:
            self._want = self._len + n

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``(batch, heads, new_len, dim)`` keys and values along dim 2; return cached + new.

        The returned views of a self-attention cache may be overwritten by a later :meth:`reorder`."""
        if self.max_len is not None:
            return self._extend_rolling(k, v)
        start, end = self._len, self._len + k.shape[2]
        if self._k is None or end > self._k.shape[2]:
            self._grow(k, v, end)
        self._k[: self._rows, :, start:end] = k
        self._v[: self._rows, :, start:end] = v
        self._len = end
        return self.k, self.v

    def _grow(self, k: Tensor, v: Tensor, end: int) -> None:
        """New buffers of at least ``end`` entries (the reserved size, else twice the old), holding the
        entries so far."""
        old_k, old_v = self.k, self.v
        rows = k.shape[0] if old_k is None else self._rows
        capacity = self._want if self._want >= end else max(end, 0 if self._k is None else 2 * self._k.shape[2])
        new_k = k.new_empty(rows, k.shape[1], capacity, k.shape[3])
        new_v = v.new_empty(rows, v.shape[1], capacity, v.shape[3])
        if old_k is not None:
            new_k[:, :, : self._len] = old_k
            new_v[:, :, : self._len] = old_v
        self._k, self._v, self._spare, self._rows = new_k, new_v, None, rows

    def _extend_rolling(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self._k is not None:
            k = torch.cat((self.k, k), dim=2)
            v = torch.cat((self.v, v), dim=2)
        if k.shape[2] > self.max_len:
            self.k, self.v = k[:, :, -self.max_len :].contiguous(), v[:, :, -self.max_len :].contiguous()
        else:
            self.k, self.v = k, v
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Select (and repeat) batch rows by a ``(new_batch,)`` long index, e.g. to follow the surviving beams."""
        if self._k is None:
            return
        if self.static or self.max_len is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
            return
        rows, length = index.shape[0], self._len
        capacity = max(self._k.shape[2], self._want)
        spare = self._spare
        if spare is None or spare[0].shape[0] < rows or spare[0].shape[2] != capacity:
            spare = tuple(b.new_empty(rows, b.shape[1], capacity, b.shape[3]) for b in (self._k, self._v))
        # written straight into the spare buffers (no temporary), which then become the cache
        torch.index_select(self.k, 0, index, out=spare[0][:rows, :, :length])
        torch.index_select(self.v, 0, index, out=spare[1][:rows, :, :length])
        self._spare = (self._k, self._v)
        self._k, self._v, self._rows = spare[0], spare[1], rows

    def __len__(self) -> int:
        return self._len


def window_keep(q_positions: Tensor, k_positions: Tensor, window: int, causal: bool) -> Tensor:
    """Bool ``(batch | 1, 1, q_len, k_len)``, True inside a sliding window of ``window`` positions.

    Causal: query ``i`` sees keys ``i - window < j <= i``, Mistral's ``sliding_window`` (Jiang et al.
    2023). Bidirectional: ``|i - j| < window``. Positions are ``(batch | 1, len)``."""
    dist = q_positions[:, :, None] - k_positions[:, None, :]  # (B, Tq, Tk)
    keep = dist < window if causal else dist.abs() < window
    return keep[:, None]


def build_attention_mask(
    key_padding_mask: Tensor | None,
    causal: bool,
    q_len: int,
    k_len: int,
    score_bias: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    keep: Tensor | None = None,
) -> tuple[Tensor | None, bool]:
    """Combine padding, causality, a window and an additive score bias into SDPA's arguments.

    Queries are the last ``q_len`` of ``k_len`` positions, so a causal mask is bottom-right aligned (what
    a KV cache needs).

    Args:
        key_padding_mask: ``(batch, k_len)`` bool, True at padding, or None.
        score_bias: ``(batch | 1, n_heads, q_len, k_len)`` additive bias (ALiBi), or None.
        dtype: dtype of a float mask.
        device: where a causal-only mask goes (default: the inputs', else the CPU).
        keep: ``(batch | 1, 1, q_len, k_len)`` bool, True = may attend (:func:`window_keep`), or None.

    Returns:
        ``(attn_mask, is_causal)``: None and True for the plain causal case, a bool mask
        ``(batch, 1, q_len, k_len)`` (True = attend) without a bias, a float mask with one.
    """
    if key_padding_mask is None and score_bias is None and keep is None:
        if not causal or q_len == 1:
            return None, False
        if q_len == k_len:
            return None, True
    allowed: Tensor | None = keep
    if causal and q_len > 1:
        if key_padding_mask is not None:
            device = key_padding_mask.device
        elif score_bias is not None:
            device = score_bias.device
        elif keep is not None:
            device = keep.device
        q_idx = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        later = (torch.arange(k_len, device=device)[None, :] <= q_idx)[None, None]  # (1,1,Tq,Tk)
        allowed = later if allowed is None else allowed & later
    if key_padding_mask is not None:
        not_pad = ~key_padding_mask[:, None, None, :]  # (B,1,1,Tk)
        allowed = not_pad if allowed is None else allowed & not_pad
    if score_bias is None:
        return allowed, False
    bias = score_bias.to(dtype)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias, False


def align_mask(
    attn_mask: Tensor | None, is_causal: bool, q_len: int, k_len: int, device: torch.device
) -> tuple[Tensor | None, bool]:
    """``(attn_mask, is_causal)`` fitted to one module's keys: the last ``k_len`` columns for a
    rolling cache, a bottom-right causal mask over a cache (SDPA aligns ``is_causal`` top-left)."""
    if attn_mask is not None and attn_mask.shape[-1] > k_len:
        attn_mask = attn_mask[..., -k_len:]
    causal = is_causal and attn_mask is None
    if causal and k_len != q_len:
        return build_attention_mask(None, True, q_len, k_len, device=device)
    return attn_mask, causal


@dataclass(frozen=True)
class AttentionInputs:
    """The self-attention arguments every layer of a stack shares, prepared once per forward pass.

    Attributes:
        mask: the mask of :func:`build_attention_mask`, or None.
        is_causal: SDPA's causal flag (set only without ``mask``).
        rotary: RoPE ``(cos, sin)``, each ``(batch | 1, 1, q_len, rotary_dim)`` fp32, or None.
        local_mask: the mask within the stack's sliding window, or None.
    """

    mask: Tensor | None = None
    is_causal: bool = False
    rotary: tuple[Tensor, Tensor] | None = None
    local_mask: Tensor | None = None

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
        window: int | None = None,
    ) -> AttentionInputs:
        """Positions -> score bias -> mask(s) -> rotary tables, the sequence every stack runs.

        Args:
            q_positions: ``(batch | 1, q_len)``.
            k_positions: ``(batch | 1, k_len)`` (cached plus new); default ``q_positions``.
            key_padding_mask: ``(batch, k_len)`` bool, True at padding, or None.
            window: the sliding window of the stack's local layers, or None.
        """
        k_positions = q_positions if k_positions is None else k_positions
        bias = position.score_bias(q_positions, k_positions, causal=causal)
        q_len, k_len = q_positions.shape[1], k_positions.shape[1]
        mask, is_causal = build_attention_mask(key_padding_mask, causal, q_len, k_len, bias, dtype)
        local = None
        if window is not None:
            keep = window_keep(q_positions, k_positions, window, causal)
            local, _ = build_attention_mask(key_padding_mask, causal, q_len, k_len, bias, dtype, keep=keep)
        return cls(mask=mask, is_causal=is_causal, rotary=position.rotary(q_positions), local_mask=local)


def sdpa(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool, enable_gqa: bool
) -> Tensor:
    """:func:`F.scaled_dot_product_attention`, in fp32 on the CPU under low-precision autocast.

    q ``(batch, n_heads, q_len, head_dim)``, k ``(batch, n_kv_heads, k_len, head_dim)``, v
    ``(batch, n_kv_heads, k_len, v_dim)`` -> ``(batch, n_heads, q_len, v_dim)``."""
    device = q.device.type
    if device == "cpu" and torch.is_autocast_enabled(device) and q.dtype in (torch.bfloat16, torch.float16):
        low = q.dtype
        with torch.autocast(device, enabled=False):
            out = F.scaled_dot_product_attention(
                q.float(),
                k.float(),
                v.float(),
                attn_mask=attn_mask.float() if attn_mask is not None and attn_mask.is_floating_point() else attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                enable_gqa=enable_gqa,
            )
        return out.to(low)
    if enable_gqa and device != "cpu" and q.dtype == torch.float32 and k.shape[1] != q.shape[1]:
        k, v, enable_gqa = *expand_kv_heads(k, v, q.shape[1]), False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa
    )


def expand_kv_heads(k: Tensor, v: Tensor, n_heads: int) -> tuple[Tensor, Tensor]:
    """Key/value heads repeated to ``n_heads`` (what ``enable_gqa`` computes): head ``h`` reads
    ``h // (n_heads // n_kv_heads)``. ``(batch, n_kv_heads, k_len, d)`` -> ``(batch, n_heads, k_len, d)``."""
    group = n_heads // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
