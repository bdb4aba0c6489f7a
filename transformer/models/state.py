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
        self_caches: one self-attention :class:`KVCache` per decoder layer (a rolling buffer for a
            sliding-window layer: ``key_positions`` and ``self_pad_mask`` cover the whole history,
            and such a layer reads their last columns).
        positions: ``(batch,)`` position of the next token of each row.
        key_positions: ``(batch, cached_len)`` positions of the cached self-attention keys.
        self_pad_mask: ``(batch, cached_len)`` bool, True at padding keys (left-padded prompts of the
            decoder-only model), or None when no row has padding.
        cross_caches: one static cross-attention cache per decoder layer (encoder-decoder only).
        memory: encoder output ``(sources, src_len, d_model)``; dropped once the cross caches are full.
        memory_mask: ``(sources, 1, 1, src_len)`` bool, True = attend, or None without source padding.
        group: decoder rows per source row. The cross-attention side (``cross_caches``, ``memory``,
            ``memory_mask``) keeps one row per source sentence, shared by ``group`` consecutive
            decoder rows (the beams or samples of that sentence), so following the beams never
            copies it: ``batch = sources * group``.
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
        """Select (and repeat) batch rows in place, e.g. expand to beams or follow surviving beams.

        Args:
            index: ``(new_batch,)`` long tensor of row indices.
            host_index: the same indices on the host, when the caller has them (the searches do):
                the cross-attention side then follows without reading ``index`` back (a host sync
                on an accelerator).
        """
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
        """Follow ``index`` on the cross-attention side, which has one row per source.

        When the new rows come in equal runs that each read one source (beams expanded, reordered
        within their sentence, or finished sentences dropped), the sources are selected once per
        run, and not at all when they stay the same; otherwise every new row gets its own copy
        (``group`` 1). Decided on the host, from ``host_index`` (else from one read of ``index``).
        """
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
        """Room for ``steps`` more tokens in every self-attention cache
        (:meth:`~transformer.modules.attention_core.KVCache.reserve`): a search that knows its longest
        continuation allocates each cache once.

        Args:
            steps: ``decode_step`` calls still to come, at most.
        """
        for cache in self.self_caches:
            cache.reserve(steps)

    @property
    def batch_size(self) -> int:
        """Number of rows (sentences × beams)."""
        return self.positions.shape[0]


def source_runs(src: list[int]) -> tuple[list[int], int]:
    """The sources of new decoder rows that read source rows ``src``, and the rows per source.

    Returns:
        ``(sources, group)``: one source per run and the run length when ``src`` comes in equal
        runs of consecutive rows (``[4, 4, 0, 0]`` -> ``([4, 0], 2)``), else ``(src, 1)``.
    """
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
    """The ``token_mask`` of ``stack``'s mixture-of-experts layers for right-padded ``tokens``.

    Args:
        tokens: ``(batch, seq_len)`` token ids, ``pad_id`` at padding.
        pad_id: the padding id.
        stack: the stack that reads the mask (:attr:`TransformerStack.routes_tokens`).

    Returns:
        ``(batch, seq_len)`` bool, True at real tokens; None when the stack has no mixture of
        experts (nothing computed) or, in eager CPU mode, when nothing is padded (read on the host,
        as for the encoder's attention mask); always a mask on an accelerator (no host sync) and
        under ``torch.compile``.
    """
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
    """Feed one token per row through a decoder stack with KV caches; update ``state`` in place.

    Args:
        embed: target embedding (with its position encoding).
        stack: the decoder stack.
        output_proj: Linear ``d_model -> vocab``.
        tokens: ``(batch, 1)`` the previous output token of each row.
        state: the caches; ``positions`` says where ``tokens`` sit.

    Returns:
        Logits ``(batch, vocab)`` for the next token.
    """
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
