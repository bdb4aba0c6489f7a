"""The two model families built from :mod:`transformer.modules`, and the builder that wires them.

The router losses and expert loads of a model's mixture-of-experts blocks (:func:`router_losses`,
:func:`update_expert_biases`, from :mod:`transformer.modules.moe_losses`) are re-exported here: the
training loop reads them through the model package.
"""

from transformer.models.builder import build_model
from transformer.models.decoder_only import DecoderOnlyModel
from transformer.models.encoder_decoder import EncoderDecoderModel
from transformer.models.flops import (
    count_parameters,
    ffn_flops_per_token,
    forward_flops,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
)
from transformer.models.state import DecodingState
from transformer.modules.moe_losses import RouterLosses, moe_blocks, router_losses, update_expert_biases

__all__ = [
    "DecoderOnlyModel",
    "DecodingState",
    "EncoderDecoderModel",
    "RouterLosses",
    "build_model",
    "count_parameters",
    "ffn_flops_per_token",
    "forward_flops",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "moe_blocks",
    "router_losses",
    "update_expert_biases",
]
