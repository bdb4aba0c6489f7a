"""Parameter counts (total, and active per token for mixtures of experts), closed-form forward
FLOPs and KV-cache sizes."""

from __future__ import annotations

from typing import Any

from torch import nn

from transformer.config import ModelSizes, kv_cache_values, layer_windows, model_sizes
from transformer.modules.attention import ATTENTION_KINDS
from transformer.modules.moe_losses import moe_blocks


def count_parameters(model: nn.Module, trainable_only: bool = False, active_only: bool = False) -> int:
    """Number of distinct parameters (tied matrices once); ``active_only`` counts what one token uses
    (``top_k`` of the routed experts, the router and shared experts fully)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    if active_only:
        for block in moe_blocks(model):
            total -= (block.experts.n_experts - block.router.top_k) * block.experts.parameters_per_expert
    return total


def ffn_flops_per_token(sizes: ModelSizes) -> int:
    """Forward matmul FLOPs of one token through one feed-forward block, ``2 * matrices * d_model *
    hidden``; for a mixture of experts the active experts, shared experts and router."""
    d = sizes.d_model
    if sizes.n_experts == 0:
        return 2 * sizes.ffn_matrices * d * sizes.ffn_hidden
    routed = 2 * sizes.ffn_matrices * d * (sizes.top_k * sizes.ffn_hidden + sizes.shared_hidden)
    return routed + 2 * d * sizes.n_experts


def forward_flops(cfg: Any, vocab_size: int, src_len: int, tgt_len: int) -> dict[str, float]:
    """Forward-pass matmul FLOPs (2 per multiply-add) of one sentence pair.

    Projections, attention scores and sums (causal: half the square; a window caps the keys), the
    feed-forward block and the output layer; embeddings, norms and softmax (< 1%) are ignored. A
    training step is about 3x (Kaplan et al. 2020). ``src_len``, ``tgt_len`` count EOS/BOS.

    Returns:
        ``{"total": F, "per_target_token": F / tgt_len, "train_per_target_token": 3 F / tgt_len}``;
        None each for a plugin attention without a cost.
    """
    sizes = model_sizes(cfg)
    d, kv, lat = sizes.d_model, sizes.kv_width, sizes.latent
    ffn = ffn_flops_per_token(sizes)
    kind = ATTENTION_KINDS[cfg.attention.name]
    if not kind.builtin:  # a plugin's attention: its cost, when it says, else unknown
        if kind.cost is None:
            return {"total": None, "per_target_token": None, "train_per_target_token": None}
        proj_params, qk_width, v_width = kind.cost(d, sizes.n_heads, sizes.n_kv_heads, sizes.head_dim, cfg.attention)
    elif lat is None:
        proj_params, qk_width, v_width = d * (d + 2 * kv) + d * d, d, d
    else:
        h = sizes.n_heads
        q = d * h * lat.qk_head_dim if lat.q_lora_rank is None else lat.q_lora_rank * (d + h * lat.qk_head_dim)
        kv_proj = d * (lat.kv_lora_rank + lat.qk_rope_head_dim) + lat.kv_lora_rank * h * (
            lat.qk_nope_head_dim + lat.v_head_dim
        )
        proj_params, qk_width, v_width = q + kv_proj + h * lat.v_head_dim * d, h * lat.qk_head_dim, h * lat.v_head_dim

    def pairs_of(n: int, causal: bool, window: int | None) -> float:
        if window is None or window >= n:
            return n * n / 2 if causal else n * n
        if causal:  # the first W queries see 1..W keys, the others W
            return window * window / 2 + (n - window) * window
        return n * (2 * window - 1)  # |i - j| < W, ignoring the edges

    def self_layer(n: int, causal: bool, window: int | None = None) -> float:
        proj = 2 * n * proj_params
        return proj + 2 * pairs_of(n, causal, window) * (qk_width + v_width) + n * ffn  # scores + weighted sum

    def stack(n: int, layers: int, causal: bool) -> float:
        return sum(self_layer(n, causal, w) for w in layer_windows(cfg, layers))

    if cfg.arch == "decoder_only":
        n = src_len + 1 + tgt_len
        total = stack(n, cfg.n_encoder_layers + cfg.n_decoder_layers, True) + 2 * n * d * vocab_size
    else:
        enc = stack(src_len, cfg.n_encoder_layers, False)
        cross = 2 * tgt_len * (d * d + d * d) + 2 * src_len * (2 * d * kv) + 4 * tgt_len * src_len * d
        dec = stack(tgt_len, cfg.n_decoder_layers, True) + cfg.n_decoder_layers * cross
        total = enc + dec + 2 * tgt_len * d * vocab_size
    return {"total": total, "per_target_token": total / tgt_len, "train_per_target_token": 3 * total / tgt_len}


def _self_attention_layers(cfg: Any) -> int:
    return cfg.n_decoder_layers + (cfg.n_encoder_layers if cfg.arch == "decoder_only" else 0)


def kv_cache_bytes_per_token(cfg: Any, bytes_per_value: int = 4) -> int:
    """Self-attention KV-cache bytes per generated token over the decoder layers: ``2 * n_kv_heads *
    head_dim`` values per layer, or ``kv_lora_rank + qk_rope_head_dim`` for MLA (DeepSeek-V2 §2.1.4)."""
    return _self_attention_layers(cfg) * kv_cache_values(cfg) * bytes_per_value


def kv_cache_bytes(cfg: Any, n_tokens: int, bytes_per_value: int = 4) -> int:
    """Self-attention KV-cache bytes of ``n_tokens`` over the decoder layers (a window-``W`` layer holds
    ``min(n_tokens, W)``)."""
    values = kv_cache_values(cfg)
    windows = layer_windows(cfg, _self_attention_layers(cfg))
    return sum(min(n_tokens, w) if w is not None else n_tokens for w in windows) * values * bytes_per_value
