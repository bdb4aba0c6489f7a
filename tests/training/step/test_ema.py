"""Exponential moving average of the weights (transformer.training.step.ema)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import tiny_model_config
from tests.training.conftest import small_config
from transformer.config import ConfigError, validate_config
from transformer.data.dataset import load_translation_data
from transformer.models import build_model
from transformer.training.checkpoint import load_checkpoint
from transformer.training.distributed.process_group import DistInfo
from transformer.training.job.run import train
from transformer.training.loop.trainer import Trainer
from transformer.training.step.ema import EMA


def _metrics(run_dir, split: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


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


# ----------------------------------------------------------------------------- in the trainer


def test_trainer_resumes_the_average_bit_for_bit(small_corpus, tmp_path) -> None:
    full, split = tmp_path / "full", tmp_path / "split"
    train(small_config(small_corpus, full, "train.max_updates=6", "train.ema_decay=0.9"))
    train(small_config(small_corpus, split, "train.max_updates=3", "train.ema_decay=0.9"))
    train(small_config(small_corpus, split, "train.max_updates=6", "train.ema_decay=0.9", "train.resume=true"))
    (avg_a, state_a), (avg_b, state_b) = (
        load_checkpoint(full, "checkpoint_last"),
        load_checkpoint(split, "checkpoint_last"),
    )
    assert state_a["ema"]["decay"] == 0.9
    for a, b in ((avg_a, avg_b), (state_a["ema"]["model"], state_b["ema"]["model"])):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    # the weights file holds the average, the training state the weights being trained
    assert not torch.equal(
        avg_a["encoder.layers.0.ffn.sublayer.w1.weight"],
        state_a["ema"]["model"]["encoder.layers.0.ffn.sublayer.w1.weight"],
    )
    assert [r["loss"] for r in _metrics(full)] == [r["loss"] for r in _metrics(split)]
    results = json.loads((full / "results.json").read_text())
    assert results["ema_decay"] == 0.9 and results["final_model"] == "checkpoint_best (EMA weights)"


def test_validation_and_test_use_the_average(small_corpus, tmp_path) -> None:
    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.max_updates=4", "train.validate_every=4", "train.ema_decay=0.8")
    train(cfg)
    logged = [r["loss"] for r in _metrics(run, "valid")]
    average, state = load_checkpoint(run, "checkpoint_last")
    trainer = Trainer(cfg, load_translation_data(cfg.data), DistInfo(0, 1, torch.device("cpu")), run)
    trainer.model.load_state_dict(average)
    assert trainer.validator.loss(trainer.model)["loss"] == pytest.approx(logged[-1], abs=1e-6)
    trainer.model.load_state_dict(state["ema"]["model"])
    assert trainer.validator.loss(trainer.model)["loss"] != pytest.approx(logged[-1], abs=1e-6)
    # the test translated with the average: the same hypotheses as the averaged weights give now
    trainer.model.load_state_dict(average)
    hyps = (run / "hyps" / "test_2016_flickr.txt").read_text(encoding="utf-8").splitlines()
    assert (
        trainer.validator.bleu(trainer.model, "test_2016_flickr")["bleu"]
        == json.loads((run / "results.json").read_text())["bleu"]
    )
    assert len(hyps) == 30


def test_config_refuses_a_decay_outside_the_unit_interval(small_corpus, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"train.ema_decay=1.0 must be in \[0, 1\)"):
        validate_config(small_config(small_corpus, tmp_path / "run", "train.ema_decay=1.0"))
