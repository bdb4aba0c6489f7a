"""Building blocks. Each module takes already-built parts and explicit sizes; none knows about Hydra."""

from transformer.modules.attention import Attention, KVCache, build_attention_mask
from transformer.modules.embedding import TokenEmbedding
from transformer.modules.ffn import FeedForward, GatedFeedForward, glu_hidden_size
from transformer.modules.layers import TransformerLayer, TransformerStack
from transformer.modules.positions import (
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
from transformer.modules.residual import PostNormResidual, PreNormResidual

__all__ = [
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
