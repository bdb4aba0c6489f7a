"""Feed-forward blocks: formulas and parameter matching."""

import torch
import torch.nn.functional as F
from torch import nn

from transformer.models.builder import build_ffn
from transformer.modules.ffn import GatedFeedForward, glu_hidden_size


def test_glu_hidden_size_matches_llama_rule():
    assert glu_hidden_size(256, 8) == 176  # int(170.67) = 170 -> 176
    assert glu_hidden_size(4 * 4096, 256) == 11008  # Llama-7B


def test_swiglu_formula():
    w13, w2 = nn.Linear(8, 12, bias=False), nn.Linear(6, 8, bias=False)
    ffn = GatedFeedForward(w13=w13, w2=w2, activation=F.silu)
    x = torch.randn(2, 3, 8)
    gate = x @ w13.weight[:6].T
    up = x @ w13.weight[6:].T
    torch.testing.assert_close(ffn(x), (F.silu(gate) * up) @ w2.weight.T)


def test_glu_parameter_count_close_to_two_matrix_ffn():
    relu = build_ffn("relu", 128, 256, False, 0.0, True, 8)
    swiglu = build_ffn("swiglu", 128, 256, False, 0.0, True, 8)
    n_relu = sum(p.numel() for p in relu.parameters())
    n_glu = sum(p.numel() for p in swiglu.parameters())
    assert abs(n_glu - n_relu) / n_relu < 0.05
    unmatched = build_ffn("geglu", 128, 256, False, 0.0, False, 8)
    assert sum(p.numel() for p in unmatched.parameters()) == 3 * 128 * 256
