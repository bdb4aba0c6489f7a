"""The encoder-decoder Transformer (Vaswani et al. 2017, §3.1)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer.models.state import DecodingState, incremental_step, real_token_mask
from transformer.modules.attention_core import AttentionInputs, KVCache
from transformer.modules.embedding import TokenEmbedding
from transformer.modules.layers import TransformerStack


class EncoderDecoderModel(nn.Module):
    """Sequence-to-sequence Transformer: an encoder over the source, a causal decoder over the target.

    Args:
        src_embed, tgt_embed: :class:`TokenEmbedding` s, each with its stack's position encoding.
        output_proj: Linear ``d_model -> tgt_vocab`` (possibly tied to the embeddings).
        n_heads: query heads (ALiBi bias shape).
        pad_id, bos_id, eos_id: special ids; ``bos_id`` starts every decoder input.
    """

    arch = "encoder_decoder"

    def __init__(
        self,
        *,
        src_embed: TokenEmbedding,
        tgt_embed: TokenEmbedding,
        encoder: TransformerStack,
        decoder: TransformerStack,
        output_proj: nn.Linear,
        n_heads: int,
        pad_id: int = 0,
        bos_id: int = 2,
        eos_id: int = 3,
    ) -> None:
        super().__init__()
        self.src_embed, self.tgt_embed = src_embed, tgt_embed
        self.encoder, self.decoder, self.output_proj = encoder, decoder, output_proj
        self.n_heads = n_heads
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.decoder_start_token_id = bos_id

    def encode(self, src_tokens: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(batch, src_len)`` right-padded source -> memory ``(batch, src_len, d_model)`` and the
        cross-attention mask ``(batch, 1, 1, src_len)`` (True = attend), or None without padding."""
        b, s = src_tokens.shape
        pad = src_tokens.eq(self.pad_id)
        # eager CPU: no mask when nothing is padded (reading the mask is free there); on an accelerator
        # (a host sync) and under torch.compile (a graph break) always a mask
        has_pad = bool(pad.any()) if pad.device.type == "cpu" and not torch.compiler.is_compiling() else True
        positions = torch.arange(s, device=src_tokens.device)[None].expand(b, s)
        x = self.src_embed(src_tokens, positions)
        attn = AttentionInputs.prepare(
            self.src_embed.position,
            positions,
            causal=False,
            key_padding_mask=pad if has_pad else None,
            dtype=x.dtype,
            window=self.encoder.window,
        )
        memory = self.encoder(x, attn, token_mask=~pad if has_pad and self.encoder.routes_tokens else None)
        return memory, (~pad[:, None, None, :] if has_pad else None)

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor) -> Tensor:
        """Teacher-forced logits ``(batch, tgt_len, tgt_vocab)`` of ``(batch, src_len)`` sources and
        ``(batch, tgt_len)`` decoder inputs (BOS + target)."""
        return self.output_proj(self.features(src_tokens, prev_output_tokens))

    def features(self, src_tokens: Tensor, prev_output_tokens: Tensor) -> Tensor:
        """:meth:`forward` without the output layer: ``(batch, tgt_len, d_model)``, which the fused loss
        projects at the target positions only."""
        memory, memory_mask = self.encode(src_tokens)
        b, t = prev_output_tokens.shape
        positions = torch.arange(t, device=prev_output_tokens.device)[None].expand(b, t)
        x = self.tgt_embed(prev_output_tokens, positions)
        attn = AttentionInputs.prepare(
            self.tgt_embed.position, positions[:1], causal=True, dtype=x.dtype, window=self.decoder.window
        )
        token_mask = real_token_mask(prev_output_tokens, self.pad_id, self.decoder)
        return self.decoder(x, attn, memory=memory, memory_mask=memory_mask, token_mask=token_mask)

    def start_decoding(self, src_tokens: Tensor) -> DecodingState:
        """Encode ``(batch, src_len)`` sources (ids + EOS) once; an empty :class:`DecodingState`, to be fed
        ``decoder_start_token_id`` first."""
        memory, memory_mask = self.encode(src_tokens)
        b = src_tokens.shape[0]
        n = len(self.decoder.layers)
        return DecodingState(
            self_caches=self.decoder.new_self_caches(),
            cross_caches=[KVCache(static=True) for _ in range(n)],
            positions=torch.zeros(b, dtype=torch.long, device=src_tokens.device),
            key_positions=torch.zeros(b, 0, dtype=torch.long, device=src_tokens.device),
            memory=memory,
            memory_mask=memory_mask,
        )

    def decode_step(self, tokens: Tensor, state: DecodingState) -> Tensor:
        """``(batch, 1)`` previous tokens -> ``(batch, tgt_vocab)`` logits; ``state`` updated in place."""
        return incremental_step(self.tgt_embed, self.decoder, self.output_proj, tokens, state)
