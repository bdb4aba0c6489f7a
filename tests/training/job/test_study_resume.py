"""The ladder study's one command resumes itself.

``python scripts/train.py -m experiment=ladder hydra/launcher=joblib hydra.launcher.n_jobs=2`` runs
every (step, seed) in a fixed folder (``runs/ladder/<step>_seed<seed>``) with ``train.resume=auto``:
re-run after a kill -9 it continues every unfinished run from its ``checkpoint_last``, and it leaves
a finished run as it is. Here: 2 steps x 2 seeds at 4 updates on a slice of real Multi30k.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import REPO_ROOT
from tests.training.conftest import small_cli_args

pytestmark = pytest.mark.slow

RUNS = [f"{step}_seed{seed}" for seed in (1, 2) for step in ("step0_vaswani2017", "step1_pre_ln")]


def _command(corpus: Path, sweep: Path) -> list[str]:
    args = [a for a in small_cli_args(corpus, sweep) if not a.startswith("run_dir=")]  # each job its own folder
    return [
        sys.executable,
        str(REPO_ROOT / "scripts" / "train.py"),
        "-m",
        "experiment=ladder",
        "ladder=step0_vaswani2017,step1_pre_ln",
        "seed=1,2",
        f"hydra.sweep.dir={sweep}",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        *args,
        "train.max_updates=4",
        "train.save_every=1",
        "train.validate_every=2",
    ]


def _sweep(corpus: Path, sweep: Path) -> subprocess.CompletedProcess:
    res = subprocess.run(
        _command(corpus, sweep),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _outcome(run: Path) -> dict:
    results = json.loads((run / "results.json").read_text())
    return {
        "weights": load_file(run / "checkpoint_last.safetensors"),
        "averaged_test": (results["bleu"], results["chrf"], results["final_model"], results["updates"]),
        "hyps": (run / "hyps" / "test_2016_flickr.txt").read_text(),
    }


def _files(sweep: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(sweep)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sweep.rglob("*")
        if p.is_file() and p.name not in ("multirun.yaml", "jobs.jsonl")  # the sweep's records of each launch
    }


@pytest.fixture(scope="module")
def reference(small_corpus, tmp_path_factory) -> Path:
    """The same sweep, never interrupted."""
    sweep = tmp_path_factory.mktemp("reference") / "ladder"
    _sweep(small_corpus, sweep)
    return sweep


def test_killed_sweep_rerun_continues_every_run_exactly_and_skips_finished_ones(small_corpus, reference, tmp_path):
    sweep = tmp_path / "ladder"
    proc = subprocess.Popen(
        _command(small_corpus, sweep),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.time() + 300
    try:  # kill -9 the whole sweep once one run has finished and another has saved a checkpoint
        while time.time() < deadline and proc.poll() is None:
            finished = [r for r in RUNS if (sweep / r / "results.json").is_file()]
            started = [r for r in RUNS if r not in finished and (sweep / r / "checkpoint_last.safetensors").is_file()]
            if finished and started:
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = [r for r in RUNS if (sweep / r / "results.json").is_file()]
    assert 0 < len(finished) < len(RUNS), "the sweep was not interrupted part way"
    finished_files = {k: v for k, v in _files(sweep).items() if k.split("/")[0] in finished}

    res = _sweep(small_corpus, sweep)  # the same command again
    for run in finished:
        assert f"{sweep / run} is complete" in res.stderr
    after = _files(sweep)
    assert {k: after[k] for k in finished_files} == finished_files  # a finished run is not retrained
    for run in RUNS:  # every run equals the uninterrupted one, bit for bit
        got, want = _outcome(sweep / run), _outcome(reference / run)
        assert got["averaged_test"] == want["averaged_test"], run
        assert got["hyps"] == want["hyps"], run
        assert got["weights"].keys() == want["weights"].keys()
        for name, tensor in want["weights"].items():
            assert got["weights"][name].equal(tensor), (run, name)

    before = _files(sweep)
    res = _sweep(small_corpus, sweep)  # complete: nothing is trained or written
    assert all(f"{sweep / run} is complete" in res.stderr for run in RUNS)
    assert _files(sweep) == before
    for run in finished:  # skipped twice: Hydra's record of each skipped job was removed again
        assert sorted(p.name for p in (sweep / run / ".hydra").iterdir()) == [
            "config.yaml",
            "hydra.yaml",
            "overrides.yaml",
        ]


def test_a_larger_budget_continues_a_complete_run(small_corpus, reference, tmp_path):
    """``train.resume=auto`` with a raised ``train.max_updates`` trains on ("train longer")."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference / RUNS[0], run)
    res = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "train.py"),
            "experiment=ladder",
            "ladder=step0_vaswani2017",
            "seed=1",
            f"hydra.run.dir={run}",
            "train.max_updates=5",
            *[a for a in small_cli_args(small_corpus, run) if a.startswith("data.")],
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "is complete" not in res.stderr
    assert json.loads((run / "results.json").read_text())["updates"] == 5


def test_runs_finished_on_another_machine_are_not_trained_again(small_corpus, reference, tmp_path):
    """A fresh machine (empty sweep folder) with ``train.finished_runs`` pointing at the finished runs'
    small files (results, metrics, config; no checkpoints, as committed under docs/results): the
    same sweep trains only the run that is not there, exactly as the uninterrupted sweep did, and
    leaves no folder for the others."""
    import shutil

    finished = tmp_path / "committed"
    for run in RUNS[:-1]:  # the last run is not finished anywhere
        (finished / run).mkdir(parents=True)
        for name in ("results.json", "metrics.jsonl", "config.yaml"):
            shutil.copy(reference / run / name, finished / run / name)
    sweep = tmp_path / "fresh" / "ladder"
    res = subprocess.run(
        _command(small_corpus, sweep) + [f"train.finished_runs={finished}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for run in RUNS[:-1]:
        assert f"{sweep / run} is finished in {finished / run}" in res.stderr
    assert f"training {sweep / RUNS[-1]}" in res.stderr
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [RUNS[-1]]  # no empty folders
    got, want = _outcome(sweep / RUNS[-1]), _outcome(reference / RUNS[-1])
    assert got["averaged_test"] == want["averaged_test"] and got["hyps"] == want["hyps"]
    assert all(got["weights"][k].equal(v) for k, v in want["weights"].items())


def test_a_sweep_of_another_field_gives_each_value_its_folder_and_row(small_corpus, tmp_path):
    """``experiment=ladder`` names folders ``<step>_seed<seed>``; sweeping another field adds it to
    the name, so two values are two runs (not one run refused as a changed resume), and compare.py
    gives each value its row."""
    sweep = tmp_path / "sweep"
    args = [a for a in small_cli_args(small_corpus, sweep) if not a.startswith("run_dir=")]
    cmd = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "train.py"),
        "-m",
        "experiment=ladder",
        "ladder=step0_vaswani2017",
        "seed=1",
        f"hydra.sweep.dir={sweep}",
        *args,
        "train.max_updates=2",
        "train.save_every=1",
        "train.validate_every=0",
        "model.dropout=0.1,0.2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted(p.name for p in sweep.iterdir() if (p / "results.json").is_file())
    assert runs == ["step0_vaswani2017_seed1_dropout=0.1", "step0_vaswani2017_seed1_dropout=0.2"]
    out = tmp_path / "comparison"
    res = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "compare.py"), str(sweep), "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = (out / "comparison.md").read_text().splitlines()
    labels = {line.split("|")[1].strip() for line in lines if line.startswith("|")}
    # two updates train nothing: the rows are marked untrained (BLEU under 1)
    rows = {
        label.removesuffix(" (untrained)").removesuffix(" (baseline)") for label in labels if label.startswith("step0")
    }
    assert rows == {"step0_vaswani2017, model.dropout=0.1", "step0_vaswani2017, model.dropout=0.2"}, rows
