"""The two model families built from :mod:`transformer.modules`, and the builder that wires them."""

from transformer.models.builder import build_model
from transformer.models.decoder_only import DecoderOnlyModel
from transformer.models.encoder_decoder import EncoderDecoderModel
from transformer.models.flops import count_parameters, forward_flops, kv_cache_bytes, kv_cache_bytes_per_token
from transformer.models.state import DecodingState

__all__ = [
    "DecoderOnlyModel",
    "DecodingState",
    "EncoderDecoderModel",
    "build_model",
    "count_parameters",
    "forward_flops",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
]
