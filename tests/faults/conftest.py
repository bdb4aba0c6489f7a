"""Fault-injection suite: each test reproduces a failure a user met with faults or bad
input, and checks that nothing hangs, no bad checkpoint is kept, no run folder is overwritten and no
output is lost.

Fixtures: a slice of real Multi30k with an empty source line in the validation and test splits, and
one tiny run trained on it (in-process, seconds) with numbered checkpoints.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.generation.helpers import compose_script_config, load_script
from tests.training.conftest import SIZES, small_cli_args, small_config, small_corpus  # noqa: F401 (fixture)

EMPTY_TEST_LINE = 4  # 0-based index of the emptied source line in the test split
EMPTY_VALID_LINE = 2


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging) when the block runs longer than ``seconds`` (SIGALRM, main thread)."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds}s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def gappy_corpus(small_corpus, tmp_path_factory) -> Path:  # noqa: F811 (the fixture imported above)
    """:func:`small_corpus` with an empty source line in the validation and the test split."""
    root = tmp_path_factory.mktemp("gappy")
    for f in small_corpus.iterdir():
        if f.is_file():
            shutil.copyfile(f, root / f.name)
    for split, index in (("test_2016_flickr", EMPTY_TEST_LINE), ("val", EMPTY_VALID_LINE)):
        lines = (root / f"{split}.en").read_text(encoding="utf-8").split("\n")
        lines[index] = ""
        (root / f"{split}.en").write_text("\n".join(lines), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def trained_run(gappy_corpus, tmp_path_factory) -> Path:
    """A tiny run (6 updates) on :func:`gappy_corpus` with checkpoint_2/4/6, best and last."""
    from transformer.training.job.run import train

    run = tmp_path_factory.mktemp("trained") / "run"
    train(small_config(gappy_corpus, run, "train.save_every=2", "train.keep_last=0"))
    return run


def script_config(name: str, *overrides: str):
    """``configs/<name>.yaml`` composed with command-line ``overrides`` (as the script receives it)."""
    return compose_script_config(name, list(overrides))


def run_script(
    name: str, *args: str, cwd: Path, env: dict | None = None, timeout: int = 300, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """``python scripts/<name>.py ARGS`` in a fresh process (as a user runs it)."""
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / f"{name}.py"), *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


__all__ = [
    "EMPTY_TEST_LINE",
    "EMPTY_VALID_LINE",
    "SIZES",
    "deadline",
    "load_script",
    "run_script",
    "script_config",
    "small_cli_args",
    "small_config",
]
