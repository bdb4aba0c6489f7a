"""One writer per run folder: a run holds an OS lock on its folder; a second
process on the same folder stops at once, naming the folder and the holder, before writing anything;
a lock held by a killed process does not block the next run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.training.conftest import small_cli_args
from transformer.runs.io import FolderLock, FolderLocked, check_unlocked, folder_locked_by_other

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_lock_names_the_holder_and_release_frees_it(tmp_path):
    with FolderLock(tmp_path / "run") as lock:
        info = json.loads(lock.path.read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        assert folder_locked_by_other(tmp_path / "run")
        with pytest.raises(
            FolderLocked,
            match=rf"run is in use by pid {os.getpid()} on {socket.gethostname()}, "
            r"running since .*: one process writes a run folder at a time",
        ):
            FolderLock(tmp_path / "run").acquire()
        with pytest.raises(FolderLocked):
            check_unlocked(tmp_path / "run")
    assert not folder_locked_by_other(tmp_path / "run")
    FolderLock(tmp_path / "run").acquire().release()


def _holder(folder: Path) -> subprocess.Popen:
    code = (
        "import sys, time; from transformer.runs.io import FolderLock; FolderLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(300)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**ENV, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_stops_before_writing_and_a_killed_holder_blocks_nothing(small_corpus, tmp_path):
    run = tmp_path / "run"
    args = small_cli_args(small_corpus, run, "train.max_updates=2", "train.validate_every=0", f"hydra.run.dir={run}")
    holder = _holder(run)
    try:
        before = _snapshot(run)
        for extra in ([], ["train.resume=true"]):
            res = subprocess.run(
                [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *args, *extra],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=240,
                env=ENV,
            )
            assert res.returncode == 1, res.stderr[-2000:]
            errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
            assert errors == [
                f"error: {run} is in use by pid {holder.pid} on {socket.gethostname()}, running since "
                f"{json.loads((run / '.lock').read_text())['started']}: one process writes a run folder "
                "at a time. Wait for it to finish (or stop it), or give this run another folder "
                "(hydra.run.dir=...)"
            ], res.stderr[-2000:]
            assert _snapshot(run) == before  # no .hydra record, no log, no config: nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    res = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=ENV,
    )
    assert res.returncode == 0, res.stderr[-2000:]  # the killed holder's lock went with it
    assert json.loads((run / "results.json").read_text())["updates"] == 2
    assert json.loads((run / ".lock").read_text())["pid"] != holder.pid


@pytest.mark.slow
def test_two_runs_started_on_one_folder_write_it_once(small_corpus, tmp_path):
    """The case of the issue: the same command twice, 2 s apart (a requeued job beside its old self)."""
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "train.py"),
        *small_cli_args(
            small_corpus,
            run,
            "train.max_updates=5000",
            "train.validate_every=0",
            "train.resume=true",
            f"hydra.run.dir={run}",
        ),
    ]
    first = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.time() + 120
    while not folder_locked_by_other(run) and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    time.sleep(2)
    second = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=ENV)
    first.send_signal(signal.SIGTERM)  # the first is still training: stop it politely
    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 75, first_err[-2000:]
    assert second.returncode == 1 and f"error: {run} is in use by pid {first.pid}" in second.stderr, second.stderr[
        -2000:
    ]
    updates = [(r["split"], r["update"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert len(updates) == len(set(updates)) and len(updates) > 1  # every update logged once
    assert not [p for p in (run / ".hydra").iterdir() if p.name.startswith("resume-")]  # the second wrote no record
