"""A polite stop: a signal of ``train.stop_signals`` finishes the update (and the
validation) in progress, saves ``checkpoint_last``, says how to continue and exits with status 75;
the resumed run equals one that was never stopped, bit for bit on the CPU."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import REPO_ROOT, torchrun_command
from tests.training.conftest import small_cli_args, small_config
from transformer.config import ConfigError, validate_config
from transformer.training.job.run import train
from transformer.training.loop.trainer import Trainer
from transformer.training.stopping import STOP_EXIT_STATUS, GracefulStop, StopRequested

DETERMINISTIC = ("loss", "nll_loss", "ntokens", "lr", "grad_norm", "bleu", "chrf", "ppl", "best")


def _curve(run: Path) -> dict[tuple[str, int], dict]:
    """metrics.jsonl without timings, the last row per (split, update) (a resumed run logs again)."""
    rows = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rows[(rec["split"], rec["update"])] = {k: rec[k] for k in DETERMINISTIC if k in rec}
    return rows


def _same_run(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "checkpoint_last.safetensors"), load_file(b / "checkpoint_last.safetensors")
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)
    assert _curve(a) == _curve(b)
    ra, rb = (json.loads((r / "results.json").read_text()) for r in (a, b))
    assert (ra["bleu"], ra["updates"], ra["best_valid"]) == (rb["bleu"], rb["updates"], rb["best_valid"])


@pytest.fixture(scope="module")
def uninterrupted(small_corpus, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("whole") / "run"
    train(small_config(small_corpus, run, "train.max_updates=10", "train.validate_every=4"))
    return run


def test_sigterm_at_a_random_update_then_resume_equals_an_uninterrupted_run(small_corpus, uninterrupted, tmp_path):
    """A real process, a real SIGTERM from outside, at an update picked at random."""
    run = tmp_path / "run"
    args = small_cli_args(small_corpus, run, "train.max_updates=10", "train.validate_every=4", f"hydra.run.dir={run}")
    when = random.Random().randint(1, 8)
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        metrics = run / "metrics.jsonl"
        if metrics.is_file() and any(
            json.loads(line)["update"] >= when
            for line in metrics.read_text().splitlines()
            if line.strip().endswith("}")
        ):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=240)
    if proc.returncode == 0:
        pytest.skip(f"the run finished before the signal (update {when}); nothing to resume")
    assert proc.returncode == STOP_EXIT_STATUS, stderr[-2000:]
    stopped = re.search(
        r"stopped by SIGTERM after update (\d+): checkpoint_last saved in (\S+); to continue, run "
        r"the same command with train.resume=auto",
        stderr,
    )
    assert stopped, stderr[-2000:]
    update = int(stopped.group(1))
    assert json.loads((run / "checkpoint_last.json").read_text())["update"] == update
    assert "Traceback" not in stderr and not (run / "results.json").exists()
    assert stopped.group(0) in (run / "train.log").read_text()

    res = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *args, "train.resume=auto"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"resumed from {run / 'checkpoint_last'} at update {update}" in res.stderr
    _same_run(run, uninterrupted)


def _signal_at(monkeypatch, method: str, update: int, sig: int = signal.SIGTERM, times: int = 1) -> None:
    """Make ``Trainer.<method>`` send ``sig`` to this process ``times`` times when it runs at ``update``."""
    original = getattr(Trainer, method)

    def wrapped(self, *args, **kwargs):
        out_before = self.update
        if method == "validate" and out_before == update:
            for _ in range(times):
                os.kill(os.getpid(), sig)  # arrives while validating: the validation still completes
        out = original(self, *args, **kwargs)
        if method == "train_step" and self.update == update:
            for _ in range(times):
                os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(Trainer, method, wrapped)


def test_signal_during_validation_stops_after_it_and_resumes_exactly(
    small_corpus, uninterrupted, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.max_updates=10", "train.validate_every=4")
    _signal_at(monkeypatch, "validate", 4, times=2)  # a second signal during the stop changes nothing
    with pytest.raises(StopRequested) as stopped:
        train(cfg)
    assert stopped.value.update == 4 and stopped.value.signal_name == "SIGTERM"
    assert ("valid", 4) in _curve(run)  # the validation in progress finished and was logged
    assert json.loads((run / "checkpoint_last.json").read_text())["update"] == 4
    monkeypatch.undo()
    train(small_config(small_corpus, run, "train.max_updates=10", "train.validate_every=4", "train.resume=true"))
    _same_run(run, uninterrupted)


def test_usr1_and_configured_signals(small_corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _signal_at(monkeypatch, "train_step", 2, sig=signal.SIGUSR1)
    with pytest.raises(StopRequested, match=r"stopped by SIGUSR1 after update 2"):
        train(small_config(small_corpus, run, "train.max_updates=10", "train.validate_every=0"))
    assert json.loads((run / "checkpoint_last.json").read_text())["update"] == 2
    # a signal that is not in train.stop_signals keeps its usual meaning (here: ignored)
    monkeypatch.undo()
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        _signal_at(monkeypatch, "train_step", 2, sig=signal.SIGUSR2)
        results = train(
            small_config(
                small_corpus,
                tmp_path / "run2",
                "train.max_updates=4",
                "train.validate_every=0",
                "train.stop_signals=[SIGTERM]",
            )
        )
        assert results["updates"] == 4
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_signal_at_the_update_where_the_budget_stops_the_run_is_logged(small_corpus, tmp_path, monkeypatch):
    """Training ends at its budget as it would have (results written, exit 0), and the log says the
    signal came (it was dropped without a word before)."""
    run = tmp_path / "run"
    _signal_at(monkeypatch, "train_step", 3)
    results = train(small_config(small_corpus, run, "train.max_updates=3", "train.validate_every=0"))
    assert results["updates"] == 3
    log = (run / "train.log").read_text()
    assert "a stop signal arrived at update 3, where training stops anyway: reached train.max_updates=3" in log


def test_the_previous_handler_gets_the_signal_after_the_save(small_corpus, tmp_path, monkeypatch):
    """submitit's protocol: its USR2 handler (checkpoint + requeue) runs once checkpoint_last is saved."""
    run = tmp_path / "run"
    calls = []
    previous = signal.signal(
        signal.SIGUSR2,
        lambda signum, frame: calls.append(json.loads((run / "checkpoint_last.json").read_text())["update"]),
    )
    try:
        _signal_at(monkeypatch, "train_step", 3, sig=signal.SIGUSR2)
        with pytest.raises(StopRequested):
            train(small_config(small_corpus, run, "train.max_updates=10", "train.validate_every=0"))
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert calls == [3]


def test_handlers_are_restored_and_bad_signal_names_are_config_errors(small_corpus, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with GracefulStop(["SIGTERM", "usr1"]) as stop:
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGTERM) == before
    for bad, words in (("SIGKILL", "cannot be caught"), ("SIGNOPE", "is not a signal name")):
        cfg = small_config(small_corpus, tmp_path / "r", f"train.stop_signals=[{bad}]")
        with pytest.raises(ConfigError, match=f"train.stop_signals: .*{words}"):
            validate_config(cfg)


@pytest.mark.slow
def test_two_ranks_signal_to_one_rank_both_stop_at_the_same_update(small_corpus, tmp_path):
    """torchrun, gloo: SIGTERM to rank 1 only; the ranks agree at the next update boundary."""
    run = tmp_path / "run"
    args = small_cli_args(
        small_corpus,
        run,
        "train.max_updates=40",
        "train.validate_every=0",
        "train.save_every=0",
        f"hydra.run.dir={run}",
    )
    proc = subprocess.Popen(
        torchrun_command(REPO_ROOT / "scripts" / "train.py", *args),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        rank1 = None
        while time.time() < deadline and proc.poll() is None:
            metrics = run / "metrics.jsonl"
            if metrics.is_file() and metrics.read_text().count('"split": "train"') >= 3:
                rank1 = _rank_pid(proc.pid, 1)
                break
            time.sleep(0.05)
        assert rank1 is not None, "rank 1 not found"
        os.kill(rank1, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stops = re.findall(r"stopped by (SIGTERM|a signal on another rank) after update (\d+)", stderr)
    assert stops and len({u for _, u in stops}) == 1, stderr[-3000:]  # one update, every rank that logs it
    update = int(stops[0][1])
    assert update < 40 and json.loads((run / "checkpoint_last.json").read_text())["update"] == update
    assert sorted(p.name for p in run.glob("checkpoint_*.safetensors")) == ["checkpoint_last.safetensors"]


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of torchrun's worker with ``RANK=rank`` (read from /proc)."""
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            stat = (proc_dir / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            environ = (proc_dir / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return int(proc_dir.name)
    return None


def _probed_torchrun(tmp_path: Path, args: list[str], probe: dict[str, str]) -> tuple[int, str, list]:
    """``scripts/train.py`` under torchrun, 2 gloo ranks, through :mod:`tests.training.rank_probe`;
    returns the exit status, stderr and each rank's record (None for a rank that wrote none)."""
    out = tmp_path / "probe"
    proc = subprocess.Popen(
        torchrun_command(REPO_ROOT / "tests" / "training" / "rank_probe.py", *args),
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PROBE_OUT": str(out), **probe},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the ranks too are killed when they hang
    )
    try:
        _, stderr = proc.communicate(timeout=150)  # longer: a rank waits on a collective the other never enters
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"the ranks hang (no exit in 150 s): {stderr[-2000:]}")
    records = [json.loads(p.read_text()) if p.is_file() else None for p in (out / "rank0.json", out / "rank1.json")]
    return proc.returncode, stderr, records


@pytest.mark.slow
@pytest.mark.parametrize(
    ("distributed", "probe"),
    [
        ("ddp", {"PROBE_RANK": "1", "PROBE_CLOCK_RATE": "6"}),  # rank 1's clock runs 6x fast
        ("fsdp", {"PROBE_RANK": "0", "PROBE_STEP_SLEEP": "0.15"}),  # rank 0 is slower
    ],
)
def test_two_ranks_stopped_by_the_time_budget_stop_together(small_corpus, tmp_path, distributed, probe):
    """torchrun, gloo: ranks whose clocks or speeds disagree stop at the same update on the time
    budget (the run's one clock, agreed at the logging points), write results.json and exit 0; a
    quiet update (not logged, validated or saved) makes no collective but the engine's gradient
    reduction (the update's token count comes from the shared batch list) and reads nothing on the
    host outside the step."""
    run = tmp_path / "run"
    args = small_cli_args(
        small_corpus,
        run,
        "train.max_updates=0",
        "train.max_time=4",
        "train.log_every=3",
        "train.validate_every=0",
        "train.save_every=0",
        f"train.distributed={distributed}",
        f"hydra.run.dir={run}",
    )
    status, stderr, records = _probed_torchrun(tmp_path, args, probe)
    assert status == 0, stderr[-3000:]
    assert all(r is not None and r["error"] is None for r in records), records
    stops = {r["stopped_at"] for r in records}
    assert len(stops) == 1, f"the ranks stopped at updates {stops}"
    stop = stops.pop()
    results = json.loads((run / "results.json").read_text())
    assert results["updates"] == stop and results["world_size"] == 2
    assert "stopped: reached train.max_time=4s" in stderr
    assert stop % 3 == 0  # decided where the ranks meet anyway: a logging point
    quiet = [u for u in range(2, stop) if u % 3]
    assert quiet
    for record in records:
        for u in quiet:
            seen = record["updates"].get(str(u), {"collectives": [], "reads": []})
            ours = [c for c in seen["collectives"] if not c.endswith(" gradients")]
            assert ours == [], (u, seen)  # the token count comes from the host: no collective of ours
            assert seen["reads"] == [], (u, seen)
