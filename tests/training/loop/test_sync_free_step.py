"""The training update reads nothing on the host, and the numbers logged are the
ones the per-update reads gave (by value, against a copy of the update as it was before)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.training.conftest import small_config
from transformer.data.dataset import load_translation_data
from transformer.training.checkpoint import load_checkpoint
from transformer.training.distributed.process_group import DistInfo
from transformer.training.job.run import train
from transformer.training.loop.trainer import Trainer, TrainingError
from transformer.training.step.divergence import DivergenceWatch
from transformer.training.step.update_stats import read_stats


def _reference_step(self: Trainer, batches: list) -> dict[str, Any]:
    """``Trainer.train_step`` as it was when it read the host: every micro-batch's loss read with
    ``.item()``, the finiteness checks on Python floats, the routing metrics read per update."""
    self.model.train()
    self.optimizer.zero_grad(set_to_none=True)
    loss_sum = nll_sum = 0.0
    ntokens = 0
    aux = z = 0.0
    load, micro = None, 0
    for i, batch in enumerate(batches):
        with self.parallel.accumulate(last=i == len(batches) - 1):
            out = self.micro_loss(batch)
            objective = out["loss"] + out["router_loss"] if "router_loss" in out else out["loss"]
            self.scaler.scale(objective).backward()
        if "moe_load" in out:
            aux += float(out["moe_aux_loss"])
            z += float(out["moe_z_loss"])
            micro += 1
            load = out["moe_load"] if load is None else load + out["moe_load"]
        loss_sum += out["loss"].detach().float().item()
        nll_sum += out["nll_loss"].detach().float().item()
        ntokens += int(out["ntokens"])
    local_tokens = ntokens
    self.scaler.unscale_(self.optimizer)
    global_loss = loss_sum  # one process
    params = [p for p in self.model.parameters() if p.grad is not None]
    torch._foreach_div_([p.grad for p in params], ntokens)  # the division after the backward pass
    assert math.isfinite(global_loss)
    clip = self.cfg.train.clip_norm
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
    lr = self.optimizer.param_groups[0]["lr"]
    self.scaler.step(self.optimizer)
    self.scaler.update()
    routing = {}
    if load is not None:
        from transformer.models import update_expert_biases

        update_expert_biases(self.model, load)
        mean = load.float().mean(dim=1).clamp(min=1e-9)
        routing = {
            "moe_aux_loss": aux / micro,
            "moe_z_loss": z / micro,
            "moe_tokens_per_expert": load.tolist(),
            "moe_max_load": float((load.float().amax(dim=1) / mean).max()),
            "moe_dropped_tokens": 0,
        }
    if self.ema is not None:
        self.ema.update(self.model)
    self.scheduler.step()
    self.state.update += 1
    return {
        "loss": loss_sum / max(local_tokens, 1),
        "nll_loss": nll_sum / max(local_tokens, 1),
        "ntokens": ntokens,
        "lr": lr,
        "grad_norm": float(grad_norm),
        **routing,
    }


def _trainer(cfg, run: Path) -> Trainer:
    return Trainer(cfg, load_translation_data(cfg.data), DistInfo(0, 1, torch.device("cpu")), run)


@pytest.mark.parametrize("device_path", [False, True], ids=["cpu", "accelerator-path"])
@pytest.mark.parametrize(
    "overrides",
    [
        ("train.update_freq=2", "train.ema_decay=0.9", "train.clip_norm=0.5"),
        ("model=llama_style_tiny", "model.n_decoder_layers=2", "model.d_model=32", "model.d_ff=64"),
        ("model/ffn=moe", "model.ffn.n_experts=2", "train.update_freq=2"),
    ],
    ids=["enc-dec", "decoder-only", "moe"],
)
def test_the_update_logs_the_numbers_it_logged_before(small_corpus, tmp_path, monkeypatch, overrides, device_path):
    """Four updates of the device-side update (read once per update by ``read_stats``, the loss
    scaled by the host's token count before the backward pass) against the reference that read
    every value as it went and divided the gradients afterwards: the same token counts, the same
    numbers up to the rounding of the scaling, the same weights up to Adam's normalisation of that
    rounding. With ``device_path`` the loss takes the accelerator's path on the CPU for the new
    update (padding masked rather than dropped)."""
    cfg = small_config(small_corpus, tmp_path / "run", *overrides)
    ref, new = _trainer(cfg, tmp_path / "a"), _trainer(cfg, tmp_path / "b")
    ref_batches, new_batches = ref.batches(), new.batches()
    tokens = 0
    for _ in range(4):
        rng = torch.get_rng_state()  # the same dropout masks in both
        want = _reference_step(ref, [next(ref_batches) for _ in range(cfg.train.update_freq)])
        torch.set_rng_state(rng)
        with monkeypatch.context() as m:
            if device_path:
                m.setattr("transformer.training.step.criterion._on_host", lambda t: False)
            stats = new.train_step([next(new_batches) for _ in range(cfg.train.update_freq)])
        assert isinstance(stats["ntokens"], int) and isinstance(stats["local_tokens"], int)  # counted on the host
        got = read_stats(stats)
        tokens += want["ntokens"]
        _same(got, want, exact=False)
    assert new.state.train_tokens == tokens
    for a, b in zip(ref.model.state_dict().values(), new.model.state_dict().values()):
        # Adam normalises the rounding noise of gradients that are zero in exact arithmetic (the
        # key projection's bias): within a few learning-rate steps, not to the last bits
        torch.testing.assert_close(b, a, rtol=1e-3, atol=2e-3)
    if new.routing.enabled:
        _same(new.routing.last, {k: v for k, v in want.items() if k.startswith("moe_")}, exact=not device_path)


def _same(got: dict[str, Any], want: dict[str, Any], exact: bool) -> None:
    """``got == want``; unless ``exact``, floats up to a relative 1e-5 (the order of summation)."""
    if exact:
        assert got == want
        return
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == (pytest.approx(value, rel=1e-5, abs=1e-6) if isinstance(value, float) else value), key


def test_logging_every_third_update_logs_the_same_numbers(small_corpus, tmp_path):
    """The host reads the device's values only at log updates: those rows hold the numbers of a run
    that logs every update, and ``train_tokens`` counts every update."""
    every, third = tmp_path / "every", tmp_path / "third"
    train(small_config(small_corpus, every, "train.validate_every=0"))
    train(small_config(small_corpus, third, "train.validate_every=0", "train.log_every=3"))
    rows = {
        r["update"]: r
        for r in map(json.loads, (every / "metrics.jsonl").read_text().splitlines())
        if r["split"] == "train"
    }
    sparse = [r for r in map(json.loads, (third / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert [r["update"] for r in sparse] == [1, 3, 6]
    for r in sparse:
        for key in ("loss", "nll_loss", "ntokens", "lr", "grad_norm", "ppl"):
            assert r[key] == rows[r["update"]][key], (r["update"], key)
    a, b = (json.loads((d / "results.json").read_text()) for d in (every, third))
    assert a["train_tokens"] == b["train_tokens"] == sum(r["ntokens"] for r in rows.values())


def _poison_update(monkeypatch, update: int) -> None:
    original = Trainer.micro_loss

    def poisoned(self, batch):
        out = original(self, batch)
        if self.update == update - 1:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(Trainer, "micro_loss", poisoned)


@pytest.mark.parametrize("save_every, found_at_save", [(3, True), (0, False)])
def test_deferred_divergence_names_the_update_and_never_saves_it(
    small_corpus, tmp_path, monkeypatch, save_every, found_at_save
):
    """The accelerator's path, run on the CPU: a NaN loss at update 5 is found at the next save
    (update 6) or log (update 8, ``log_every=4``), and the stop message names update 5 and the last
    finite checkpoint; nothing non-finite is saved."""
    monkeypatch.setattr(DivergenceWatch, "defer_on_cpu", True)
    _poison_update(monkeypatch, 5)
    run = tmp_path / "run"
    cfg = small_config(
        small_corpus,
        run,
        "train.max_updates=10",
        f"train.save_every={save_every}",
        "train.validate_every=0",
        "train.log_every=4",
    )
    with pytest.raises(TrainingError, match=r"non-finite loss \(nan\) at update 5; ") as err:
        train(cfg)
    logged = [r["update"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert logged == [1, 4]  # update 8's row is not written: the check comes first
    if found_at_save:
        assert "(update 3)" in str(err.value)
        _, state = load_checkpoint(run, "checkpoint_last")
        assert state["update"] == 3
        assert all(torch.isfinite(t).all() for t in load_checkpoint(run, "checkpoint_last")[0].values())
    else:
        assert "no checkpoint of this run was saved before it" in str(err.value)
        assert not list(run.glob("checkpoint_*"))


def test_deferred_watch_keeps_the_first_finding(tmp_path):
    watch = DivergenceWatch(torch.device("cpu"))
    assert not watch.deferred
    with pytest.raises(TrainingError, match=r"non-finite gradient norm \(inf\) at update 2"):
        watch.record(2, torch.tensor(1.0), torch.tensor(float("inf")), None)
    watch.deferred = True
    watch.record(1, torch.tensor(1.0), torch.tensor(2.0), None)
    watch.check(None)  # finite so far
    watch.record(2, torch.tensor(1.0), torch.tensor(float("nan")), None)
    watch.record(3, torch.tensor(float("inf")), torch.tensor(float("nan")), None)
    with pytest.raises(
        TrainingError, match=r"non-finite gradient norm \(nan\) at update 2; .*checkpoint_last \(update 7\)"
    ):
        watch.check((tmp_path / "checkpoint_last", 7))
