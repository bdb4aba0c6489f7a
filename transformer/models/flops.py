"""Closed-form parameter counts, forward FLOPs and KV-cache sizes."""

from __future__ import annotations

from typing import Any

from torch import nn

from transformer.config import head_dim, model_sizes, resolve_n_kv_heads


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of distinct parameters (tied matrices count once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def forward_flops(cfg: Any, vocab_size: int, src_len: int, tgt_len: int) -> dict[str, float]:
    """Forward-pass FLOPs (2 per multiply-add) of one sentence pair, matmuls only.

    Counts the projections, the attention scores and weighted sums (causal: half the square), the
    feed-forward block and the output projection; embeddings, norms and softmax are ignored (they
    are < 1% at these sizes). A training step costs about 3x the forward pass (Kaplan et al. 2020).
    The decoder-only model reads ``src_len + 1 + tgt_len`` tokens.

    Args:
        cfg: a model config.
        vocab_size: output vocabulary.
        src_len, tgt_len: sentence lengths in tokens (with their EOS/BOS).

    Returns:
        ``{"total": F, "per_target_token": F / tgt_len, "train_per_target_token": 3 F / tgt_len}``.
    """
    sizes = model_sizes(cfg)
    d, kv = sizes.d_model, sizes.kv_width
    ffn = 2 * sizes.ffn_matrices * d * sizes.ffn_hidden

    def self_layer(n: int, causal: bool) -> float:
        proj = 2 * n * (d * (d + 2 * kv) + d * d)
        pairs = n * n / 2 if causal else n * n
        return proj + 4 * pairs * d + n * ffn  # scores + weighted sum: 2 * 2 * pairs * d

    if cfg.arch == "decoder_only":
        n = src_len + 1 + tgt_len
        total = (cfg.n_encoder_layers + cfg.n_decoder_layers) * self_layer(n, True) + 2 * n * d * vocab_size
    else:
        enc = cfg.n_encoder_layers * self_layer(src_len, False)
        cross = 2 * tgt_len * (d * d + d * d) + 2 * src_len * (2 * d * kv) + 4 * tgt_len * src_len * d
        dec = cfg.n_decoder_layers * (self_layer(tgt_len, True) + cross)
        total = enc + dec + 2 * tgt_len * d * vocab_size
    return {"total": total, "per_target_token": total / tgt_len, "train_per_target_token": 3 * total / tgt_len}


def kv_cache_bytes_per_token(cfg: Any, bytes_per_value: int = 4) -> int:
    """Self-attention KV-cache bytes added per generated token (all decoder layers, K and V).

    Scales with ``n_kv_heads / n_heads``: ``2 * layers * n_kv_heads * head_dim * bytes``.
    """
    layers = cfg.n_decoder_layers + (cfg.n_encoder_layers if cfg.arch == "decoder_only" else 0)
    return 2 * layers * resolve_n_kv_heads(cfg) * head_dim(cfg) * bytes_per_value
