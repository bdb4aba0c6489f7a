"""The training loop end to end on a small slice of real Multi30k (tiny model, seconds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT, torchrun_command
from tests.training.conftest import small_cli_args, small_config
from transformer.config import validate_config
from transformer.training.checkpoint import load_checkpoint
from transformer.training.job.run import train
from transformer.training.loop.trainer import Trainer, TrainingError


def _metrics(run_dir: Path, split: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def _weights(run_dir: Path, name: str = "checkpoint_last") -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir, name)[0]


def test_training_run_writes_results_and_artifacts(small_corpus, tmp_path):
    cfg = small_config(small_corpus, tmp_path / "run", "logger=wandb")
    validate_config(cfg)
    results = train(cfg)
    run = tmp_path / "run"
    saved = json.loads((run / "results.json").read_text())
    for key in (
        "bleu",
        "chrf",
        "sacrebleu_signature",
        "params",
        "updates",
        "wall_time_s",
        "train_tokens_per_s",
        "peak_memory_mb",
        "choices",
        "config",
        "precision",
        "hardware",
    ):
        assert key in saved, key
    assert saved["precision"] == "fp32" and saved["hardware"]["torch"] == torch.__version__
    assert saved["updates"] == 6 and saved["params"] == results["params"] > 0
    assert saved["sacrebleu_signature"].startswith("nrefs:1")
    assert len((run / "hyps" / "test_2016_flickr.txt").read_text().splitlines()) == 30
    assert (run / "config.yaml").is_file() and (run / "spm.model").is_file()
    assert [r["update"] for r in _metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert [r["update"] for r in _metrics(run, "valid")] == [3, 6]
    assert list((run / "wandb").glob("offline-run-*")), "wandb offline wrote no run folder"


def test_decoder_only_trains(small_corpus, tmp_path):
    cfg = small_config(
        small_corpus,
        tmp_path / "run",
        "model=llama_style_tiny",
        "model.n_decoder_layers=2",
        "model.d_model=32",
        "model.d_ff=64",
        "train.max_updates=2",
        "train.validate_every=2",
    )
    results = train(cfg)
    assert results["updates"] == 2 and results["bleu"] is not None


def test_resume_equals_uninterrupted_bit_for_bit(small_corpus, tmp_path):
    full, split = tmp_path / "full", tmp_path / "split"
    train(small_config(small_corpus, full, "train.max_updates=6"))
    train(small_config(small_corpus, split, "train.max_updates=3"))
    train(small_config(small_corpus, split, "train.max_updates=6", "train.resume=true"))
    a, b = _weights(full), _weights(split)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    losses_full = [r["loss"] for r in _metrics(full)]
    losses_split = [r["loss"] for r in _metrics(split)]
    assert losses_full == losses_split


def test_prefetched_batches_train_and_resume_as_collated_in_the_loop(small_corpus, tmp_path):
    """``train.prefetch=3`` (batches collated ahead in a thread) trains the same updates as 0, across
    an epoch's end; its checkpoint records the batches trained on (not those prepared ahead), so a
    run stopped and resumed with it equals the uninterrupted one bit for bit."""
    full, split = tmp_path / "full", tmp_path / "split"
    common = ["train.update_freq=6", "train.validate_every=0", "train.valid_bleu=false"]  # 8 updates > 1 epoch
    train(small_config(small_corpus, full, *common, "train.max_updates=8", "train.prefetch=0"))
    train(small_config(small_corpus, split, *common, "train.max_updates=4", "train.prefetch=3"))
    _, state = load_checkpoint(split, "checkpoint_last")
    assert state["sampler"] == {"epoch": 1, "position": 24}
    train(small_config(small_corpus, split, *common, "train.max_updates=8", "train.prefetch=3", "train.resume=true"))
    a, b = _weights(full), _weights(split)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [r["loss"] for r in _metrics(full)] == [r["loss"] for r in _metrics(split)]
    assert _metrics(full)[-1]["epoch"] == _metrics(split)[-1]["epoch"] == 2


def test_the_tested_average_includes_the_last_update_of_a_resumed_run(small_corpus, tmp_path):
    """With ``train.average_last``, the end of training is a numbered checkpoint even off the
    ``save_every`` grid, so a run resumed to train longer tests weights that include its last
    updates; ``results.json`` names the updates the tested weights were saved at."""
    run = tmp_path / "run"
    common = ["train.save_every=2", "train.average_last=2", "train.validate_every=0", "train.valid_bleu=false"]
    train(small_config(small_corpus, run, *common, "train.max_updates=4"))
    first = json.loads((run / "results.json").read_text())
    assert first["final_model"] == "average of checkpoint_2, checkpoint_4"
    assert first["test_weights_updates"] == [2, 4] and first["test_weights_note"] is None
    train(small_config(small_corpus, run, *common, "train.max_updates=5", "train.resume=true"))
    resumed = json.loads((run / "results.json").read_text())
    assert resumed["updates"] == 5 and resumed["final_model"] == "average of checkpoint_4, checkpoint_5"
    assert resumed["test_weights_updates"] == [4, 5]


def test_tested_weights_older_than_the_last_update_are_named():
    from transformer.training.job.results import tested_updates_note

    assert tested_updates_note([1500], 2557) == "update 1,500 of 2,557: the last 1,057 not tested"
    assert tested_updates_note([200, 300], 320) == "updates 200, 300 of 320: the last 20 not tested"
    assert tested_updates_note([300, 320], 320) is None and tested_updates_note([], 5) is None


def test_nan_loss_stops_naming_the_update_and_keeps_last_checkpoint(small_corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.max_updates=10", "train.save_every=2", "train.validate_every=0")
    original = Trainer.micro_loss

    def poisoned(self, batch):
        out = original(self, batch)
        if self.update == 4:  # the 5th update
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(Trainer, "micro_loss", poisoned)
    with pytest.raises(TrainingError, match="at update 5"):
        train(cfg)
    _, state = load_checkpoint(run, "checkpoint_last")
    assert state["update"] == 4
    assert all(torch.isfinite(t).all() for t in _weights(run).values())


def _run_train(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "scripts/train.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )


def test_sigkill_then_resume_continues_from_last_checkpoint(small_corpus, tmp_path):
    run = tmp_path / "run"
    args = small_cli_args(
        small_corpus,
        run,
        "train.max_updates=100000",
        "train.save_every=2",
        "train.validate_every=0",
        f"hydra.run.dir={run}",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "scripts/train.py", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    # checkpoint_last is written after each numbered checkpoint: once checkpoint_8 (or a later one,
    # the oldest are pruned) exists, it holds update 6 or more
    while max((int(p.stem.split("_")[1]) for p in run.glob("checkpoint_[0-9]*.json")), default=0) < 8:
        assert proc.poll() is None and time.time() < deadline, "training ended or stalled before its 4th checkpoint"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = load_checkpoint(run, "checkpoint_last")[1]["update"]
    assert saved >= 6 and saved % 2 == 0
    out = _run_train(
        small_cli_args(
            small_corpus,
            run,
            f"train.max_updates={saved + 2}",
            "train.save_every=2",
            "train.validate_every=0",
            "train.resume=true",
            f"hydra.run.dir={run}",
        )
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"at update {saved} " in out.stderr
    assert json.loads((run / "results.json").read_text())["updates"] == saved + 2


def _torchrun(args: list[str], port: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = torchrun_command("scripts/train.py", *args)
    if port is not None:
        command[4] = f"--master_port={port}"
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("distributed", "update_freq"), [("ddp", 2), ("fsdp", 2)]
)  # 2 ranks with update_freq 1: the resume test
def test_two_process_gloo_matches_one_process_same_global_batch(small_corpus, tmp_path, distributed, update_freq):
    """2 ranks x update_freq k = 1 rank x update_freq 2k, for DistributedDataParallel and FSDP2.

    With k > 1 the gradients are summed in another order (rank-local sums, then across ranks). The
    key bias has a gradient that is mathematically zero (softmax ignores a shift shared by all
    keys); Adam with eps 1e-9 would turn its rounding noise into full-size steps, so the test uses
    eps 1e-6, which leaves every other parameter's update unchanged.
    """
    one, two = tmp_path / "one", tmp_path / "two"
    common = [
        "model.dropout=0.0",
        "train.max_updates=3",
        "train.validate_every=0",
        "train.valid_bleu=false",
        "optim.eps=1e-6",
    ]
    out1 = _run_train(
        small_cli_args(small_corpus, one, *common, f"train.update_freq={2 * update_freq}", f"hydra.run.dir={one}")
    )
    assert out1.returncode == 0, out1.stderr[-2000:]
    out2 = _torchrun(
        small_cli_args(
            small_corpus,
            two,
            *common,
            f"train.update_freq={update_freq}",
            f"train.distributed={distributed}",
            f"hydra.run.dir={two}",
        )
    )
    assert out2.returncode == 0, out2.stderr[-3000:]
    results = json.loads((two / "results.json").read_text())
    assert results["world_size"] == 2 and results["updates"] == 3 and results["bleu"] is not None
    a, b = _weights(one), _weights(two)  # FSDP: full weights gathered on rank 0, same file format
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("distributed", ["ddp", "fsdp"])
def test_two_ranks_resume_exactly_with_dropout(small_corpus, tmp_path, distributed):
    """2 gloo ranks with dropout 0.3, saved at update 2 and resumed from there to update 4, end at
    the uninterrupted run's weights bit for bit: each rank restores its own random state (rank 1
    drew rank 0's masks before), the data position and, under FSDP2, the full weights and optimizer
    state by parameter name. The final test, decoded by both ranks, equals one process's (checked
    under DDP)."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    common = [
        "model.dropout=0.3",
        "train.max_updates=4",
        "train.validate_every=0",
        "train.valid_bleu=false",
        "train.save_every=2",
        f"train.distributed={distributed}",
    ]
    out1 = _torchrun(small_cli_args(small_corpus, whole, *common, f"hydra.run.dir={whole}"))
    assert out1.returncode == 0, out1.stderr[-3000:]
    _, state = load_checkpoint(whole, "checkpoint_2")
    assert state["update"] == 2 and len(state["rng_ranks"]) == 2 and state["optimizer"]["state"]
    assert not torch.equal(state["rng_ranks"][0]["torch"], state["rng_ranks"][1]["torch"])
    out2 = _torchrun(
        small_cli_args(
            small_corpus, resumed, *common, f"train.resume_from={whole / 'checkpoint_2'}", f"hydra.run.dir={resumed}"
        )
    )
    assert out2.returncode == 0, out2.stderr[-3000:]
    assert "at update 2 " in out2.stderr
    a, b = _weights(whole), _weights(resumed)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    if distributed == "fsdp":
        return  # the shared decoding is the same code under both engines (FSDP: full weights on every rank)
    # the two ranks decoded the test split together: one process decoding the tested weights
    # writes the same hypotheses and scores
    evaluated = tmp_path / "evaluated"
    out3 = subprocess.run(
        [sys.executable, "scripts/evaluate.py", f"checkpoint={resumed}", f"output_dir={evaluated}", "progress=false"],
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out3.returncode == 0, out3.stderr[-3000:]
    trained = json.loads((resumed / "results.json").read_text())
    split = trained["test_split"]
    assert (evaluated / f"{split}.txt").read_bytes() == (resumed / "hyps" / f"{split}.txt").read_bytes()
    assert json.loads((evaluated / "results.json").read_text())["splits"][split]["bleu"] == trained["bleu"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(small_corpus, tmp_path, precision):
    cfg = small_config(
        small_corpus,
        tmp_path / "run",
        f"train.precision={precision}",
        "train.max_updates=2",
        "train.validate_every=0",
        "train.valid_bleu=false",
    )
    results = train(cfg)
    assert results["updates"] == 2 and results["precision"] == precision
    weights = _weights(tmp_path / "run")
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in weights.values())


def test_an_old_checkpoint_with_one_random_state_loads_on_every_rank_and_warns_ranks_above_0(small_corpus, tmp_path):
    """A checkpoint written before every rank's random state was saved (``rng`` alone) still
    resumes under torchrun: rank 0 takes its state, a rank above 0 takes it too and is told its
    dropout masks differ from an uninterrupted run's."""
    from transformer.data.dataset import load_translation_data
    from transformer.training.distributed.process_group import DistInfo

    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.max_updates=1", "train.validate_every=0", "train.valid_bleu=false")
    train(cfg)
    weights, state = load_checkpoint(run, "checkpoint_last")
    assert len(state["rng_ranks"]) == 1 and torch.equal(state["rng_ranks"][0]["torch"], state["rng"]["torch"])
    del state["rng_ranks"]  # as such a checkpoint was written
    data = load_translation_data(cfg.data)
    cpu = torch.device("cpu")
    rank0 = Trainer(cfg, data, DistInfo(0, 2, cpu), tmp_path / "r0", parallel_mode="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rank0.load_state(weights, state)
    rank1 = Trainer(cfg, data, DistInfo(1, 2, cpu), tmp_path / "r1", parallel_mode="none")
    with pytest.warns(UserWarning, match="rank 1: the checkpoint holds the random state of 1 rank"):
        rank1.load_state(weights, state)
    assert torch.equal(torch.get_rng_state(), state["rng"]["torch"])
