"""Building blocks. Each module takes already-built parts and explicit sizes; none knows about Hydra.

Each switch has one table beside the classes it names: ``NORMS`` (norms.py), ``FFNS`` (ffn.py),
``POSITIONS`` (positions.py), ``RESIDUALS`` (residual.py) and ``ATTENTION_KINDS`` (attention.py).
"""

from transformer.modules.attention import ATTENTION_KINDS, Attention, KVCache, build_attention_mask
from transformer.modules.embedding import TokenEmbedding
from transformer.modules.ffn import FFNS, FeedForward, GatedFeedForward, glu_hidden_size
from transformer.modules.norms import NORMS, RMSNorm
from transformer.modules.layers import TransformerLayer, TransformerStack
from transformer.modules.positions import (
    POSITIONS,
    ALiBi,
    LearnedPositionalEmbedding,
    NoPositions,
    PositionEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_slopes,
    apply_rotary,
    sinusoidal_table,
)
from transformer.modules.residual import RESIDUALS, PostNormResidual, PreNormResidual

__all__ = [
    "ATTENTION_KINDS",
    "FFNS",
    "NORMS",
    "POSITIONS",
    "RESIDUALS",
    "ALiBi",
    "Attention",
    "FeedForward",
    "GatedFeedForward",
    "KVCache",
    "LearnedPositionalEmbedding",
    "NoPositions",
    "PositionEncoding",
    "PostNormResidual",
    "PreNormResidual",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "TokenEmbedding",
    "TransformerLayer",
    "TransformerStack",
    "alibi_slopes",
    "apply_rotary",
    "build_attention_mask",
    "glu_hidden_size",
    "sinusoidal_table",
]
