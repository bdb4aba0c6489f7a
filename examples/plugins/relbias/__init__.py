"""A learned relative position bias (T5, Raffel et al. 2020, §2.1): each head adds to its attention
score a learned scalar for the query-key distance, bucketed, exact up to ``num_buckets // 2`` and
logarithmic up to ``model.position.max_distance`` (farther keys share the last bucket).

    python scripts/train.py plugins=[examples/plugins/relbias] model/position=relbias model.position.num_buckets=32
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from transformer.config import PositionConfig
from transformer.modules.positions import PositionEncoding
from transformer.registry import register_position


@dataclass
class RelBiasConfig(PositionConfig):
    name: str = "relbias"
    num_buckets: int = 32  # per direction in a causal stack; split between the two in an encoder
    max_distance: int = 128  # distances from here on share the last bucket

    def validate(self):  # called with the option's fields before anything is built
        if not 4 <= self.num_buckets <= self.max_distance:
            raise ValueError(f"model.position.num_buckets={self.num_buckets} must be in [4, max_distance]")


@register_position("relbias", config=RelBiasConfig)
class RelativeBias(PositionEncoding):
    def __init__(self, *, n_heads: int, num_buckets: int, max_distance: int):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bias = nn.Embedding(num_buckets, n_heads)  # a learned score per bucket and head
        nn.init.zeros_(self.bias.weight)  # starts as no position information

    @classmethod
    def from_sizes(cls, *, d_model, n_heads, max_positions, rope_theta, rotary_dim, rope_scaling, config):
        return cls(n_heads=n_heads, num_buckets=config.num_buckets, max_distance=config.max_distance)

    def buckets(self, distance, causal):  # (batch, q_len, k_len) long: query position - key position
        n, offset = self.num_buckets, 0
        if causal:
            distance = distance.clamp(min=0)  # later keys are masked anyway
        else:
            n //= 2
            offset = (distance < 0).long() * n  # keys after the query: the other half of the buckets
            distance = distance.abs()
        exact = n // 2  # distances below this have a bucket each
        log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(self.max_distance / exact)
        far = (exact + log_ratio * (n - exact)).long().clamp(max=n - 1)  # logarithmic up to max_distance
        return offset + torch.where(distance < exact, distance, far)

    def score_bias(self, q_positions, k_positions, causal):
        # q_positions (batch, q_len), k_positions (batch, k_len) long -> fp32 (batch, n_heads, q_len, k_len)
        distance = q_positions[:, :, None] - k_positions[:, None, :]
        return self.bias(self.buckets(distance, causal)).permute(0, 3, 1, 2).float()
