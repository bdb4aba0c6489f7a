"""Building blocks. Each module takes already-built parts and explicit sizes; none knows about Hydra.

Each switch has one table beside the classes it names: ``NORMS`` (norms.py), ``FFNS`` (ffn.py; its
``moe`` entry is :class:`~transformer.modules.moe.MixtureOfExperts`, whose router scores are
``ROUTER_SCORES`` in moe_router.py, its losses in moe_losses.py), ``POSITIONS`` (positions.py),
``ROPE_SCALINGS`` (rope_scaling.py), ``RESIDUALS`` (residual.py) and ``ATTENTION_KINDS``
(attention.py; multi-head latent attention in mla.py). The KV cache (a rolling buffer for
sliding-window layers), the mask builder and :class:`AttentionInputs` live in attention_core.py.
Constructors take keyword arguments only (``Attention(n_heads=8, n_kv_heads=8, head_dim=64, ...)``),
except the norms, called ``cls(d_model, eps=eps)`` as :class:`torch.nn.LayerNorm`, and
:class:`~transformer.modules.dropout.Dropout` (``Dropout(p)``, as :class:`torch.nn.Dropout`).
A stack's self-attention mask, causal flag and RoPE tables are prepared once per forward pass
(:meth:`AttentionInputs.prepare`) and read by every layer. The hand-written autograd kernels these
modules call live in :mod:`transformer.kernels`.
"""

from transformer.modules.attention import ATTENTION_KINDS, Attention, AttentionKind
from transformer.modules.attention_core import AttentionInputs, KVCache, build_attention_mask, window_keep
from transformer.modules.embedding import TokenEmbedding
from transformer.modules.ffn import FFNS, FeedForward, GatedFeedForward, glu_hidden_size
from transformer.modules.layers import TransformerLayer, TransformerStack
from transformer.modules.mla import MultiHeadLatentAttention
from transformer.modules.moe import GroupedExperts, MixtureOfExperts
from transformer.modules.moe_losses import router_losses
from transformer.modules.moe_router import ROUTER_SCORES, TopKRouter
from transformer.modules.norms import NORMS, RMSNorm
from transformer.modules.positions import (
    POSITIONS,
    ALiBi,
    LearnedPositionalEmbedding,
    NoPositions,
    PositionEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_slopes,
    sinusoidal_table,
)
from transformer.modules.residual import RESIDUALS, PostNormResidual, PreNormResidual
from transformer.modules.rope_scaling import ROPE_SCALINGS, RopeScaling

__all__ = [
    "ATTENTION_KINDS",
    "FFNS",
    "NORMS",
    "POSITIONS",
    "RESIDUALS",
    "ROPE_SCALINGS",
    "ROUTER_SCORES",
    "ALiBi",
    "Attention",
    "AttentionInputs",
    "AttentionKind",
    "FeedForward",
    "GatedFeedForward",
    "GroupedExperts",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadLatentAttention",
    "MixtureOfExperts",
    "NoPositions",
    "PositionEncoding",
    "PostNormResidual",
    "PreNormResidual",
    "RMSNorm",
    "RopeScaling",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "TokenEmbedding",
    "TopKRouter",
    "TransformerLayer",
    "TransformerStack",
    "alibi_slopes",
    "build_attention_mask",
    "glu_hidden_size",
    "router_losses",
    "sinusoidal_table",
    "window_keep",
]
