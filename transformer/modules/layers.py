"""A Transformer layer (self-attention, optional cross-attention, feed-forward) and a stack of them.

A local layer's self-attention sees a sliding window (Mistral; Gemma 2/3 alternate local and
global layers) through the stack's windowed mask and a rolling KV cache. A mixture-of-experts
feed-forward module gets the stack's ``token_mask``, so padding counts in none of its statistics."""

from __future__ import annotations

from torch import Tensor, nn

from transformer.modules.attention_core import AttentionInputs, KVCache
from transformer.modules.moe import MixtureOfExperts

_NO_INPUTS = AttentionInputs()  # no mask, not causal, no rotation


class TransformerLayer(nn.Module):
    """One encoder layer, or decoder layer with ``cross_attn``: residual blocks around attention and the
    feed-forward module; ``window`` makes its self-attention local.

    Raises:
        ValueError: a window < 1.
    """

    def __init__(
        self, *, self_attn: nn.Module, ffn: nn.Module, cross_attn: nn.Module | None = None, window: int | None = None
    ) -> None:
        super().__init__()
        if window is not None and window < 1:
            raise ValueError(f"window={window} must be >= 1 (or None for global attention)")
        self.self_attn, self.cross_attn, self.ffn = self_attn, cross_attn, ffn
        self.window = window
        # a mixture of experts (in its residual block) is given the token mask
        self.routes_tokens = isinstance(getattr(ffn, "sublayer", ffn), MixtureOfExperts)

    def new_self_cache(self) -> KVCache:
        """An empty self-attention cache for decoding: a rolling buffer of ``window`` entries for a
        local layer, unbounded for a global one."""
        return KVCache(max_len=self.window)

    def forward(
        self,
        x: Tensor,
        attn_inputs: AttentionInputs = _NO_INPUTS,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        token_mask: Tensor | None = None,
    ) -> Tensor:
        """``(batch, seq_len, d_model)`` -> the same.

        Args:
            attn_inputs: mask, causal flag and RoPE tables (:meth:`AttentionInputs.prepare`).
            memory: encoder output ``(batch, src_len, d_model)`` (decoder layers).
            memory_mask: ``(batch, 1, 1, src_len)`` bool, True = attend, or None.
            token_mask: ``(batch, seq_len)`` bool, True at real tokens, or None; read by a mixture of experts.

        Raises:
            ValueError: a local layer given inputs prepared without a window.
        """
        mask, is_causal = attn_inputs.mask, attn_inputs.is_causal
        if self.window is not None:
            if attn_inputs.local_mask is None:
                raise ValueError("a sliding-window layer needs AttentionInputs.prepare(..., window=...)")
            mask, is_causal = attn_inputs.local_mask, False
        x = self.self_attn(x, attn_mask=mask, is_causal=is_causal, rotary=attn_inputs.rotary, cache=self_cache)
        if self.cross_attn is not None:
            x = self.cross_attn(x, memory=memory, attn_mask=memory_mask, cache=cross_cache)
        if self.routes_tokens and token_mask is not None:
            return self.ffn(x, token_mask=token_mask)
        return self.ffn(x)


class TransformerStack(nn.Module):
    """Layers in order, then an optional final norm (pre-LN; Identity for post-LN).

    ``window`` is the local layers' sliding window (None: all global); ``routes_tokens`` says whether a
    layer has a mixture of experts (only then is the padding mask built).

    Raises:
        ValueError: local layers with different windows.
    """

    def __init__(self, *, layers: list[TransformerLayer], final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        windows = {layer.window for layer in layers} - {None}
        if len(windows) > 1:
            raise ValueError(f"the local layers of a stack share one window, got {sorted(windows)}")
        self.window: int | None = windows.pop() if windows else None  # the local layers' window
        self.routes_tokens = any(layer.routes_tokens for layer in layers)  # reads a token_mask

    def new_self_caches(self) -> list[KVCache]:
        """One empty self-attention cache per layer (:meth:`TransformerLayer.new_self_cache`)."""
        return [layer.new_self_cache() for layer in self.layers]

    def forward(
        self,
        x: Tensor,
        attn_inputs: AttentionInputs = _NO_INPUTS,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        self_caches: list[KVCache] | None = None,
        cross_caches: list[KVCache] | None = None,
        token_mask: Tensor | None = None,
    ) -> Tensor:
        """:meth:`TransformerLayer.forward`'s arguments with one cache per layer; ``attn_inputs`` and
        ``token_mask`` are prepared once for every layer."""
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                attn_inputs,
                memory=memory,
                memory_mask=memory_mask,
                self_cache=None if self_caches is None else self_caches[i],
                cross_cache=None if cross_caches is None else cross_caches[i],
                token_mask=token_mask,
            )
        return self.final_norm(x)
