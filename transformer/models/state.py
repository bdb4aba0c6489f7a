"""Decoding state shared by both model families, the one incremental step they both use, and the
token mask of the padding that their mixture-of-experts layers read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer.modules.attention_core import AttentionInputs, KVCache
from transformer.modules.embedding import TokenEmbedding
from transformer.modules.layers import TransformerStack


@dataclass
class DecodingState:
    """Everything a model needs to extend its hypotheses by one token.

    Attributes:
        self_caches: one self-attention :class:`KVCache` per decoder layer (a sliding-window layer's
            rolling buffer reads the last columns of the masks below).
        positions: ``(batch,)`` position of each row's next token.
        key_positions: ``(batch, cached_len)`` positions of the cached keys.
        self_pad_mask: ``(batch, cached_len)`` bool, True at padding keys (left-padded prompts), or None.
        cross_caches: one static cross-attention cache per decoder layer (encoder-decoder only).
        memory: encoder output ``(sources, src_len, d_model)``; dropped once the cross caches are full.
        memory_mask: ``(sources, 1, 1, src_len)`` bool, True = attend, or None.
        group: decoder rows per source row (``batch = sources * group``): the cross-attention side keeps
            one row per sentence, so following the beams never copies it.
    """

    self_caches: list[KVCache]
    positions: Tensor
    key_positions: Tensor
    self_pad_mask: Tensor | None = None
    cross_caches: list[KVCache] | None = None
    memory: Tensor | None = None
    memory_mask: Tensor | None = None
    group: int = 1

    def reorder(self, index: Tensor, host_index: Sequence[int] | None = None) -> None:
        """Select (and repeat) batch rows by a ``(new_batch,)`` index, in place; ``host_index``, the same on
        the host, spares a device read for the cross-attention side."""
        rows = self.positions.shape[0]
        for cache in self.self_caches:
            cache.reorder(index)
        self.positions = self.positions.index_select(0, index)
        self.key_positions = self.key_positions.index_select(0, index)
        if self.self_pad_mask is not None:
            self.self_pad_mask = self.self_pad_mask.index_select(0, index)
        if self.cross_caches is not None:
            self._reorder_sources(index, rows // self.group, host_index)

    def _reorder_sources(self, index: Tensor, n_sources: int, host_index: Sequence[int] | None) -> None:
        """Follow ``index`` on the cross-attention side: once per run of rows reading one source (not at
        all when unchanged), else a copy per row (``group`` 1); decided on the host."""
        host = index.tolist() if host_index is None else host_index
        sources, group = source_runs([i // self.group for i in host])
        self.group = group
        if sources == list(range(n_sources)):
            return  # the same sources in the same order: nothing to copy
        rows = torch.tensor(sources, dtype=torch.long).to(index.device, non_blocking=True)
        for cache in self.cross_caches or ():
            cache.reorder(rows)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, rows)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, rows)

    def reserve(self, steps: int) -> None:
        """Room for ``steps`` more tokens in every self-attention cache, so each allocates once."""
        for cache in self.self_caches:
            cache.reserve(steps)

    @property
    def batch_size(self) -> int:
        """Number of rows (sentences × beams)."""
        return self.positions.shape[0]


def source_runs(src: list[int]) -> tuple[list[int], int]:
    """``(sources, group)``: one source per run and the run length when ``src`` comes in equal runs
    (``[4, 4, 0, 0]`` -> ``([4, 0], 2)``), else ``(src, 1)``."""
    sources: list[int] = []
    counts: list[int] = []
    for s in src:
        if sources and sources[-1] == s:
            counts[-1] += 1
        else:
            sources.append(s)
            counts.append(1)
    group = len(src) // max(len(sources), 1)
    if len(sources) * group != len(src) or any(c != group for c in counts):
        return list(src), 1  # irregular runs: one source row per decoder row
    return sources, group


def real_token_mask(tokens: Tensor, pad_id: int, stack: TransformerStack) -> Tensor | None:
    """``(batch, seq_len)`` bool, True at the real tokens of right-padded ``tokens``, for ``stack``'s
    mixture-of-experts layers; None without such layers or, in eager CPU mode, without padding."""
    if not stack.routes_tokens:
        return None
    real = tokens.ne(pad_id)
    if tokens.device.type != "cpu" or torch.compiler.is_compiling():
        return real
    return None if bool(real.all()) else real


def incremental_step(
    embed: TokenEmbedding,
    stack: TransformerStack,
    output_proj: nn.Linear,
    tokens: Tensor,
    state: DecodingState,
) -> Tensor:
    """Feed ``(batch, 1)`` tokens through a decoder stack with KV caches at ``state.positions``; update
    ``state`` in place and return ``(batch, vocab)`` next-token logits."""
    pos = state.positions[:, None]  # (B, 1)
    k_positions = torch.cat((state.key_positions, pos), dim=1)  # (B, Tk)
    pad_mask = state.self_pad_mask
    if pad_mask is not None:
        pad_mask = torch.cat((pad_mask, pad_mask.new_zeros(pad_mask.shape[0], 1)), dim=1)
    x = embed(tokens, pos)
    attn = AttentionInputs.prepare(
        embed.position, pos, k_positions, causal=True, key_padding_mask=pad_mask, dtype=x.dtype, window=stack.window
    )
    h = stack(
        x,
        attn,
        memory=state.memory,
        memory_mask=state.memory_mask,
        self_caches=state.self_caches,
        cross_caches=state.cross_caches,
    )
    state.positions = state.positions + 1
    state.key_positions = k_positions
    state.self_pad_mask = pad_mask
    state.memory = None  # the cross-attention caches now hold its keys and values
    return output_proj(h[:, -1])
