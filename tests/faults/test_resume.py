"""Resume never damages a run.

1. Resume takes the run's own saved config; the command line may change only a documented set of
   fields (``train.max_updates`` ...), any other difference is an error naming the fields, raised
   before anything in the folder is written (config.yaml and .hydra/ stay as they were).
2. A truncated ``checkpoint_last`` names the numbered checkpoints and ``train.resume_from=PATH``.
3. Temporary files left by a killed save are removed on start and on resume.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.faults.conftest import run_script, small_cli_args, small_config
from transformer.training.job.run import train


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def rope_run(gappy_corpus, tmp_path_factory) -> Path:
    """A RoPE run trained from the command line (4 updates, checkpoint_2 and checkpoint_4)."""
    run = tmp_path_factory.mktemp("rope") / "run"
    res = run_script(
        "train",
        *small_cli_args(
            gappy_corpus,
            run,
            "model/position=rope",
            f"hydra.run.dir={run}",
            "train.max_updates=4",
            "train.save_every=2",
            "train.keep_last=0",
        ),
        cwd=run.parent,
    )
    assert res.returncode == 0, res.stderr
    return run


def test_readme_resume_line_continues_with_the_runs_own_config(rope_run, gappy_corpus, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(rope_run, run)
    hydra_before = {k: v for k, v in _snapshot(run).items() if k.startswith(".hydra/")}
    res = run_script(
        "train",
        f"hydra.run.dir={run}",
        "train.resume=true",
        "train.max_updates=6",
        f"data.root={gappy_corpus}",
        "train.progress=false",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    results = json.loads((run / "results.json").read_text())
    assert results["updates"] == 6
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.model.position.name == "rope" and saved.model.d_model == 32 and saved.train.max_updates == 6
    after = _snapshot(run)
    assert {k: after[k] for k in hydra_before} == hydra_before  # the run's .hydra/ is untouched


def test_a_different_model_on_resume_is_an_error_before_anything_is_written(rope_run, gappy_corpus, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(rope_run, run)
    before = _snapshot(run)
    res = run_script(
        "train",
        *small_cli_args(
            gappy_corpus,
            run,
            "model/position=sinusoidal",
            f"hydra.run.dir={run}",
            "train.max_updates=6",
            "train.save_every=2",
            "train.keep_last=0",
            "train.resume=true",
        ),
        cwd=tmp_path,
    )
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.position.name" in errors[0] and "train.max_updates" in errors[0]
    assert "Traceback" not in res.stderr
    assert _snapshot(run) == before  # config.yaml, .hydra/, checkpoints: all as they were


def test_resume_with_the_same_overrides_in_process(trained_run, gappy_corpus, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    results = train(
        small_config(
            gappy_corpus, run, "train.save_every=2", "train.keep_last=0", "train.resume=true", "train.max_updates=8"
        )
    )
    assert results["updates"] == 8


def test_truncated_checkpoint_last_names_numbered_checkpoints_and_resume_from(trained_run, gappy_corpus, tmp_path):
    from transformer.training.checkpoint import CheckpointError

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    last = run / "checkpoint_last.safetensors"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    common = ("train.save_every=2", "train.keep_last=0", "train.max_updates=8")
    with pytest.raises(CheckpointError) as err:
        train(small_config(gappy_corpus, run, *common, "train.resume=true"))
    message = str(err.value)
    for name in ("checkpoint_2", "checkpoint_4", "checkpoint_6", "train.resume_from="):
        assert name in message, message
    results = train(small_config(gappy_corpus, run, *common, f"train.resume_from={run / 'checkpoint_4'}"))
    assert results["updates"] == 8
    updates = [
        json.loads(line)["update"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "train"
    ]
    assert updates[-4:] == [5, 6, 7, 8]


def test_stale_temporaries_are_removed_on_start_and_on_resume(trained_run, gappy_corpus, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    stale = [
        run / ".checkpoint_last.safetensors.k3j9x2.tmp",
        run / ".checkpoint_last.pt.a1b2c3.tmp",
        run / ".results.json.zz9.tmp",
    ]
    for p in stale:
        p.write_bytes(b"\0" * 1000)
    mine = run / "notes.tmp"
    mine.write_text("a user's file")
    train(
        small_config(
            gappy_corpus, run, "train.save_every=2", "train.keep_last=0", "train.resume=true", "train.max_updates=7"
        )
    )
    assert not any(p.exists() for p in stale) and mine.is_file()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".checkpoint_best.json.q1w2.tmp").write_text("{")
    train(small_config(gappy_corpus, fresh, "train.max_updates=1", "train.validate_every=0"))
    assert not list(fresh.glob(".*.tmp"))


def test_resume_may_change_how_the_run_computes_but_not_what(trained_run, gappy_corpus):
    """The documented fields (here the machine's: distribution, activation checkpointing, encoding
    workers) may change on resume; a field of the optimisation is an error naming it."""
    from transformer.config import ConfigError
    from transformer.training.checkpoint import load_checkpoint
    from transformer.training.job.resume import resume_config

    saved = load_checkpoint(trained_run, "checkpoint_last")[1]["config"]
    common = ("train.save_every=2", "train.keep_last=0", "train.resume=true", "train.max_updates=8")
    cfg = small_config(
        gappy_corpus,
        trained_run,
        *common,
        "train.distributed=fsdp",
        "train.activation_checkpointing=true",
        "data.preprocess_workers=2",
    )
    run_cfg = resume_config(cfg, saved, None)  # outside Hydra every field counts as named
    assert (run_cfg.train.distributed, run_cfg.train.activation_checkpointing, run_cfg.train.max_updates) == (
        "fsdp",
        True,
        8,
    )
    with pytest.raises(ConfigError, match=r"train\.update_freq \(1 in the run, 2 on the command line\)"):
        resume_config(small_config(gappy_corpus, trained_run, *common, "train.update_freq=2"), saved, None)
