"""Parameter counts (total, and active per token for mixtures of experts), closed-form forward
FLOPs and KV-cache sizes."""

from __future__ import annotations

from typing import Any

from torch import nn

from transformer.config import ModelSizes, kv_cache_values, layer_windows, model_sizes
from transformer.modules.attention import ATTENTION_KINDS
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

    Counts the projections, the attention scores and weighted sums (causal: half the square; a
    sliding window of ``W`` caps each query's keys at ``W``), the feed-forward block (for a mixture
    of experts the active experts and the router, see :func:`ffn_flops_per_token`) and the output
    projection; embeddings, norms and softmax are ignored (they are < 1% at these sizes). A training
    step costs about 3x the forward pass (Kaplan et al. 2020). The decoder-only model reads
    ``src_len + 1 + tgt_len`` tokens. Multi-head latent attention counts its down- and
    up-projections and scores over ``qk_nope_head_dim + qk_rope_head_dim`` per head.

    Args:
        cfg: a model config.
        vocab_size: output vocabulary.
        src_len, tgt_len: sentence lengths in tokens (with their EOS/BOS).

    Returns:
        ``{"total": F, "per_target_token": F / tgt_len, "train_per_target_token": 3 F / tgt_len}``;
        each None (unknown) for a plugin's attention that does not give its cost.
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
    """Self-attention KV-cache bytes added per generated token (all decoder layers).

    ``layers * values * bytes``, with ``values`` per layer and token ``2 * n_kv_heads * head_dim``
    (K and V; scales with ``n_kv_heads / n_heads``) or, for multi-head latent attention,
    ``kv_lora_rank + qk_rope_head_dim`` (the latent and the shared RoPE key, DeepSeek-V2 §2.1.4).
    A sliding-window layer adds these bytes only until its rolling buffer holds ``W`` tokens
    (:func:`kv_cache_bytes`).
    """
    return _self_attention_layers(cfg) * kv_cache_values(cfg) * bytes_per_value


def kv_cache_bytes(cfg: Any, n_tokens: int, bytes_per_value: int = 4) -> int:
    """Self-attention KV-cache bytes of one sequence of ``n_tokens`` (all decoder layers): a
    sliding-window layer of window ``W`` holds ``min(n_tokens, W)`` tokens (its rolling buffer),
    a global layer all of them."""
    values = kv_cache_values(cfg)
    windows = layer_windows(cfg, _self_attention_layers(cfg))
    return sum(min(n_tokens, w) if w is not None else n_tokens for w in windows) * values * bytes_per_value
