"""A decoder-only causal LM that translates as a prefix LM: ``source <sep> target <eos>``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer.models.state import DecodingState, incremental_step, real_token_mask
from transformer.modules.attention_core import AttentionInputs
from transformer.modules.embedding import TokenEmbedding
from transformer.modules.layers import TransformerStack


class DecoderOnlyModel(nn.Module):
    """Causal Transformer LM (Radford et al. 2018; Llama, Touvron et al. 2023) used as a prefix LM:
    ``source <sep> target`` in one sequence, the loss on the target only; decoding runs the source
    prefix once into the KV cache, then starts from ``<sep>``.

    Args:
        output_proj: Linear ``d_model -> vocab``.
        n_heads: query heads (ALiBi bias shape).
    """

    arch = "decoder_only"

    def __init__(
        self,
        *,
        embed: TokenEmbedding,
        decoder: TransformerStack,
        output_proj: nn.Linear,
        n_heads: int,
        pad_id: int = 0,
        sep_id: int = 4,
        eos_id: int = 3,
    ) -> None:
        super().__init__()
        self.embed, self.decoder, self.output_proj = embed, decoder, output_proj
        self.n_heads = n_heads
        self.pad_id, self.sep_id, self.eos_id = pad_id, sep_id, eos_id
        self.decoder_start_token_id = sep_id

    def forward(self, tokens: Tensor) -> Tensor:
        """Teacher-forced logits ``(batch, seq_len, vocab)`` of right-padded ``source <sep> target`` tokens."""
        return self.output_proj(self.features(tokens))

    def features(self, tokens: Tensor) -> Tensor:
        """:meth:`forward` without the output layer: ``(batch, seq_len, d_model)``, which the fused loss
        projects at the target positions only."""
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device)[None]  # (1, T)
        x = self.embed(tokens, positions.expand(b, t))
        attn = AttentionInputs.prepare(
            self.embed.position, positions, causal=True, dtype=x.dtype, window=self.decoder.window
        )
        return self.decoder(x, attn, token_mask=real_token_mask(tokens, self.pad_id, self.decoder))

    def start_decoding(self, src_tokens: Tensor) -> DecodingState:
        """Left-pad the ``(batch, src_len)`` sources (no specials) and run them once through the stack; a
        :class:`DecodingState` holding them, to be fed ``sep_id`` first."""
        b, s = src_tokens.shape
        device = src_tokens.device
        lengths = src_tokens.ne(self.pad_id).sum(1)  # (B,)
        caches = self.decoder.new_self_caches()
        idx = torch.arange(s, device=device)[None] - (s - lengths)[:, None]  # (B, S)
        pad_mask = idx < 0
        positions = idx.clamp(min=0)
        if s > 0:
            left = src_tokens.gather(1, positions).masked_fill(pad_mask, self.pad_id)
            x = self.embed(left, positions)
            has_pad = bool(pad_mask.any())
            attn = AttentionInputs.prepare(
                self.embed.position,
                positions,
                causal=True,
                key_padding_mask=pad_mask if has_pad else None,
                dtype=x.dtype,
                window=self.decoder.window,
            )
            self.decoder(
                x, attn, self_caches=caches, token_mask=~pad_mask if has_pad and self.decoder.routes_tokens else None
            )
        else:
            has_pad = False
        return DecodingState(
            self_caches=caches,
            positions=lengths.clone(),
            key_positions=positions,
            self_pad_mask=pad_mask if has_pad else None,
        )

    def decode_step(self, tokens: Tensor, state: DecodingState) -> Tensor:
        """One incremental step. Args: tokens ``(batch, 1)``. Returns logits ``(batch, vocab)``."""
        return incremental_step(self.embed, self.decoder, self.output_proj, tokens, state)
