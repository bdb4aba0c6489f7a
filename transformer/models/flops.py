"""Parameter counts (total, and active per token for mixtures of experts), closed-form forward
FLOPs and KV-cache sizes."""

from __future__ import annotations

from typing import Any

from torch import nn

from transformer.config import ModelSizes, head_dim, model_sizes, resolve_n_kv_heads
from transformer.modules.moe_losses import moe_blocks


def count_parameters(model: nn.Module, trainable_only: bool = False, active_only: bool = False) -> int:
    """Number of distinct parameters (tied matrices count once).

    Args:
        model: any module.
        trainable_only: count only parameters with ``requires_grad``.
        active_only: count the parameters one token uses: in each mixture-of-experts block only
            ``top_k`` of the ``n_experts`` routed experts (the router and shared experts fully).
            Equal to the total for a dense model.

    Returns:
        The count.
    """
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
    """Forward matmul FLOPs of one token through one feed-forward block: ``2 * matrices * d_model *
    hidden``; for a mixture of experts the ``top_k`` experts it is routed to, the shared experts and
    the router (``2 * d_model * n_experts``), i.e. the *active* computation."""
    d = sizes.d_model
    if sizes.n_experts == 0:
        return 2 * sizes.ffn_matrices * d * sizes.ffn_hidden
    routed = 2 * sizes.ffn_matrices * d * (sizes.top_k * sizes.ffn_hidden + sizes.shared_hidden)
    return routed + 2 * d * sizes.n_experts


def forward_flops(cfg: Any, vocab_size: int, src_len: int, tgt_len: int) -> dict[str, float]:
    """Forward-pass FLOPs (2 per multiply-add) of one sentence pair, matmuls only.

    Counts the projections, the attention scores and weighted sums (causal: half the square), the
    feed-forward block (for a mixture of experts the active experts and the router, see
    :func:`ffn_flops_per_token`) and the output projection; embeddings, norms and softmax are ignored (they
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
    ffn = ffn_flops_per_token(sizes)

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
