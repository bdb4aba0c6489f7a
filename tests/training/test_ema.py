"""Exponential moving average of the weights (transformer.training.ema)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model_config
from transformer.models import build_model
from transformer.training.ema import EMA


def _model():
    return build_model(tiny_model_config(), 40)  # tie_embeddings=all: three names, one matrix


def _step(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def test_average_follows_the_formula() -> None:
    model = _model()
    ema = EMA(model, 0.9)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    for seed in range(3):
        _step(model, seed)
        ema.update(model)
        for k, v in model.state_dict().items():
            want[k] = 0.9 * want[k] + 0.1 * v
    got = ema.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=0)
        assert got[k].dtype == torch.float32
    assert got["src_embed.embedding.weight"] is got["output_proj.weight"]  # tied: one average


def test_averages_load_into_the_model_and_back() -> None:
    model = _model()
    ema = EMA(model, 0.99)
    _step(model, 0)
    ema.update(model)
    other = _model()
    other.load_state_dict(ema.state_dict())  # the averages are a state dict of the model
    again = EMA(other, 0.99)
    again.load_state_dict(ema.state_dict())
    for a, b in zip(again.shadow, ema.shadow):
        assert torch.equal(a, b)
    with pytest.raises(KeyError, match="EMA state lacks"):
        again.load_state_dict({})


def test_swapped_uses_the_averages_and_restores_exactly() -> None:
    model = _model()
    ema = EMA(model, 0.5)
    _step(model, 1)
    ema.update(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped(model) as m:
        for k, v in m.state_dict().items():
            assert torch.equal(v, ema.state_dict()[k])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    with pytest.raises(RuntimeError, match="inside"):
        with ema.swapped(model):
            raise RuntimeError("inside")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.1, 1.5])
def test_decay_must_be_inside_the_unit_interval(decay: float) -> None:
    with pytest.raises(ValueError, match=r"train.ema_decay=.* must be in \(0, 1\)"):
        EMA(_model(), decay)
