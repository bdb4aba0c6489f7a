"""Test helpers for the exporters: tiny configs of each family and a model trained to reverse its input.

Random-weight models decode to the maximum length, where peers legitimately differ (HF gives a
forced EOS the log-probability 0, we give it the model's); the reversal model ends its outputs with
EOS by itself, so beam searches can be compared hypothesis for hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import tiny_model_config
from transformer.interop import ExportError, unsupported
from transformer.interop.hf_moe import to_hf_moe
from transformer.models import build_model

LLAMA = {
    "arch": "decoder_only",
    "n_encoder_layers": 0,
    "norm_position": "pre",
    "norm.name": "rmsnorm",
    "ffn.name": "swiglu",
    "position.name": "rope",
    "position.rope_theta": 500.0,
    "attention.name": "gqa",
    "attention.n_kv_heads": 2,
    "bias": False,
    "tie_embeddings": "none",
    "scale_embeddings": False,
    "init": "normal",
}


def perturbed(model: nn.Module, std: float = 0.05, seed: int = 0) -> nn.Module:
    """Add noise to every parameter (non-trivial norms and biases), in place; returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def _reversal_batch(g: torch.Generator, n: int, vocab: int, max_len: int = 8):
    lens = torch.randint(2, max_len + 1, (n,), generator=g).tolist()
    src = torch.zeros(n, max_len + 1, dtype=torch.long)
    prev = torch.zeros(n, max_len + 1, dtype=torch.long)
    tgt = torch.zeros(n, max_len + 1, dtype=torch.long)
    for i, length in enumerate(lens):
        s = torch.randint(5, vocab, (length,), generator=g)
        src[i, :length], src[i, length] = s, 3
        prev[i, 0], prev[i, 1 : length + 1] = 2, s.flip(0)
        tgt[i, :length], tgt[i, length] = s.flip(0), 3
    return src, prev, tgt


def reversal_model(vocab: int = 40, steps: int = 120, seed: int = 0, **overrides):
    """A tiny 2017 encoder-decoder (d 32, 2+2 layers) trained for ``steps`` Adam updates to reverse
    random sequences of ids ``5..vocab-1`` (lengths 2-8, EOS appended on both sides).

    Returns:
        ``(model, cfg)``: the model in eval mode and its model config.
    """
    torch.manual_seed(seed)
    cfg = tiny_model_config(**overrides)
    model = build_model(cfg, vocab)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        src, prev, tgt = _reversal_batch(g, 48, vocab)
        loss = F.cross_entropy(model(src, prev).flatten(0, 1), tgt.flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), cfg


def random_sources(n: int, vocab: int, seed: int = 0, lo: int = 2, hi: int = 9) -> list[list[int]]:
    """``n`` id lists of lengths in ``[lo, hi)`` from ``5..vocab-1`` (no specials)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, vocab, (int(k),), generator=g).tolist() for k in torch.randint(lo, hi, (n,), generator=g)]


def assert_moe_export_refuses(
    cfg: Any, switch: str, judged: Callable[[Any], list[str]], target: str, hf_class: str
) -> None:
    """A Mixtral / DeepSeek-V3 export of ``cfg`` is refused naming ``switch``: ``judged(cfg)`` (the
    family's ``*_unsupported``) lists it, ``format=hf`` picks ``target``, and ``to_hf_moe`` raises an
    ``ExportError`` that names the Hugging Face class and the switch."""
    reasons = judged(cfg)
    assert any(why.startswith(switch) for why in reasons), reasons
    assert unsupported(cfg, "hf")[0] == target
    pattern = f"cannot export to Hugging Face {hf_class}: .*{switch.replace('.', '[.]')}"
    with pytest.raises(ExportError, match=pattern):
        to_hf_moe(build_model(cfg, 40), cfg)
