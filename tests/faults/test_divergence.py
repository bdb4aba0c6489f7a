"""Divergence is detected on the gradient norm and the weights too; non-finite
weights are never saved; the stop message names the checkpoint that is truly the last finite one."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT, torchrun_command
from tests.faults.conftest import small_cli_args, small_config
from transformer.training.checkpoint import load_checkpoint
from transformer.training.job.run import train
from transformer.training.loop.trainer import Trainer, TrainingError


def _all_saved_weights_finite(run: Path) -> list[str]:
    names = sorted(p.name[: -len(".safetensors")] for p in run.glob("checkpoint_*.safetensors"))
    for name in names:
        weights, _ = load_checkpoint(run, name)
        bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        assert not bad, f"{name} holds non-finite tensors: {bad[:3]}"
    return names


def _named_checkpoint(message: str, run: Path) -> tuple[str, int]:
    m = re.search(r"(checkpoint_\w+) \(update (\d+)\)", message)
    assert m, message
    assert (run / f"{m.group(1)}.safetensors").is_file()
    return m.group(1), int(m.group(2))


def test_huge_learning_rate_never_saves_nan_weights(small_corpus, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(
        small_corpus,
        run,
        "optim.lr=1e6",
        "lr_scheduler=constant",
        "train.save_every=1",
        "train.validate_every=0",
        "train.max_updates=8",
        "train.keep_last=0",
    )
    with pytest.raises(TrainingError) as err:
        train(cfg)
    names = _all_saved_weights_finite(run)
    name, update = _named_checkpoint(str(err.value), run)
    assert name in names
    assert json.loads((run / f"{name}.json").read_text())["update"] == update


def test_nan_gradient_with_finite_loss_stops_at_that_update(small_corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.save_every=1", "train.validate_every=0", "train.max_updates=6")
    original = Trainer.micro_loss

    def poisoned(self, batch):
        out = original(self, batch)
        if self.update == 2:  # the 3rd update: finite loss, NaN gradient
            next(self.model.parameters()).register_hook(lambda g: torch.full_like(g, float("nan")))
        return out

    monkeypatch.setattr(Trainer, "micro_loss", poisoned)
    with pytest.raises(TrainingError, match=r"gradient norm.*update 3") as err:
        train(cfg)
    assert _named_checkpoint(str(err.value), run) == ("checkpoint_last", 2)
    _all_saved_weights_finite(run)


def test_non_finite_weights_are_not_saved(small_corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.save_every=1", "train.validate_every=0", "train.max_updates=6")
    original = Trainer.train_step

    def step(self, batches, ntokens=None):
        out = original(self, batches, ntokens)
        if self.update == 3:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("inf"))
        return out

    monkeypatch.setattr(Trainer, "train_step", step)
    with pytest.raises(TrainingError, match=r"non-finite weights.*update 3") as err:
        train(cfg)
    assert _named_checkpoint(str(err.value), run) == ("checkpoint_last", 2)
    _all_saved_weights_finite(run)


@pytest.mark.parametrize("distributed", ["ddp", "fsdp"])
def test_two_ranks_stop_together_and_save_nothing_non_finite(small_corpus, tmp_path, distributed):
    """Under torchrun every rank finds the divergence at the same update and stops with the same
    message (none is left waiting in a collective); no saved weights are non-finite (FSDP: each rank
    checks its shards, the ranks add up what they found)."""
    run = tmp_path / "run"
    args = small_cli_args(
        small_corpus,
        run,
        "optim.lr=1e6",
        "lr_scheduler=constant",
        "train.save_every=1",
        "train.validate_every=0",
        "train.max_updates=8",
        "train.keep_last=0",
        f"train.distributed={distributed}",
        f"hydra.run.dir={run}",
    )
    res = subprocess.run(
        torchrun_command("scripts/train.py", *args),
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode != 0
    errors = re.findall(r"error: training diverged: .*? \(lower optim\.lr", res.stderr)
    assert len(errors) == 2 and errors[0] == errors[1], res.stderr[-3000:]  # both ranks, the same update
    name, update = _named_checkpoint(errors[0], run)
    assert name in _all_saved_weights_finite(run)
    assert json.loads((run / f"{name}.json").read_text())["update"] == update
