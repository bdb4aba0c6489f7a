"""TempGLU: SwiGLU whose gate has a learnable temperature, ``w2(silu((x W_gate) / tau) * (x W_up))``,
with ``tau`` learned by each block from ``model.ffn.tau0`` (Swish with a trainable beta = 1 / tau,
Ramachandran et al. 2017, as the gate of a GLU, Shazeer 2020). ``tau0=1`` starts as SwiGLU.

    python scripts/train.py plugins=[examples/plugins/tempglu] model/ffn=tempglu model.ffn.tau0=0.5
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer.config import FFNConfig
from transformer.modules.ffn import GatedFeedForward
from transformer.registry import register_ffn


@dataclass
class TempGLUConfig(FFNConfig):
    name: str = "tempglu"
    tau0: float = 1.0  # the gate's temperature at initialisation

    def validate(self):  # called with the option's fields before anything is built
        if not self.tau0 > 0:
            raise ValueError(f"model.ffn.tau0={self.tau0} must be > 0")


@register_ffn("tempglu", activation=F.silu, config=TempGLUConfig)
class TempGLU(GatedFeedForward):  # hidden_size and n_matrices (3) are GatedFeedForward's
    def __init__(self, *, tau0: float, **parts):
        super().__init__(**parts)
        self.log_tau = nn.Parameter(torch.tensor(math.log(tau0)))  # learned in log space: tau stays > 0

    @classmethod
    def from_sizes(cls, *, d_model, hidden, activation, bias, dropout, config):  # config: the model.ffn node
        return cls(
            w13=nn.Linear(d_model, 2 * hidden, bias=bias),  # gate and up rows, one matmul
            w2=nn.Linear(hidden, d_model, bias=bias),
            activation=activation,
            dropout=dropout,
            tau0=config.tau0,
        )

    def forward(self, x):  # (batch, seq_len, d_model) -> (batch, seq_len, d_model)
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(self.dropout(self.activation(gate / self.log_tau.exp()) * up))
