"""A Transformer layer (self-attention, optional cross-attention, feed-forward) and a stack of them."""

from __future__ import annotations

from torch import Tensor, nn

from transformer.modules.attention import AttentionInputs, KVCache

_NO_INPUTS = AttentionInputs()  # no mask, not causal, no rotation


class TransformerLayer(nn.Module):
    """One encoder layer (no cross-attention) or decoder layer (with it).

    Each part is a residual block (:class:`PostNormResidual` or :class:`PreNormResidual`) around an
    :class:`Attention` or feed-forward module.

    Args:
        self_attn: residual block around self-attention.
        ffn: residual block around the feed-forward module.
        cross_attn: residual block around cross-attention, or None.
    """

    def __init__(self, *, self_attn: nn.Module, ffn: nn.Module, cross_attn: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn, self.cross_attn, self.ffn = self_attn, cross_attn, ffn

    def forward(
        self,
        x: Tensor,
        attn_inputs: AttentionInputs = _NO_INPUTS,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
    ) -> Tensor:
        """Args:
            x: ``(batch, seq_len, d_model)``.
            attn_inputs: the self-attention mask, causal flag and RoPE tables for the positions of
                ``x`` (:meth:`AttentionInputs.prepare`).
            memory: encoder output ``(batch, src_len, d_model)`` (decoder layers).
            memory_mask: ``(batch, 1, 1, src_len)`` bool, True = attend, or None.
            self_cache / cross_cache: KV caches for incremental decoding.

        Returns:
            ``(batch, seq_len, d_model)``.
        """
        x = self.self_attn(
            x, attn_mask=attn_inputs.mask, is_causal=attn_inputs.is_causal, rotary=attn_inputs.rotary, cache=self_cache
        )
        if self.cross_attn is not None:
            x = self.cross_attn(x, memory=memory, attn_mask=memory_mask, cache=cross_cache)
        return self.ffn(x)


class TransformerStack(nn.Module):
    """Layers applied in order, then an optional final norm (pre-LN stacks; Identity for post-LN).

    Args:
        layers: the :class:`TransformerLayer` s.
        final_norm: applied to the last layer's output.
    """

    def __init__(self, *, layers: list[TransformerLayer], final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()

    def forward(
        self,
        x: Tensor,
        attn_inputs: AttentionInputs = _NO_INPUTS,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        self_caches: list[KVCache] | None = None,
        cross_caches: list[KVCache] | None = None,
    ) -> Tensor:
        """Same arguments as :meth:`TransformerLayer.forward`, with one cache per layer;
        ``attn_inputs`` is prepared once and read by every layer.

        Returns:
            ``(batch, seq_len, d_model)``.
        """
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                attn_inputs,
                memory=memory,
                memory_mask=memory_mask,
                self_cache=None if self_caches is None else self_caches[i],
                cross_cache=None if cross_caches is None else cross_caches[i],
            )
        return self.final_norm(x)
