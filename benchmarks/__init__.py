"""The benchmarks: speed and memory of the zoo against its peers, each run from the repository's root
as ``python -m benchmarks.NAME`` on the installed package (``pip install -e .``).

A module with a command line (a ``main`` under ``if __name__ == "__main__"``) is one benchmark, and no
other module imports it; what two benchmarks share lives in a library module (``ab.py``: the A/B
harness over ``scripts/train.py`` processes; ``decoding.py``: ours, HF ``generate`` and CTranslate2
on the same weights; ``train_step.py``: the models under test and their timed step; ``peers.py``)
or here: :data:`REPO` (the checkout they measure), :func:`git_commit` (the commit a report names),
:func:`module_command` and :func:`worker_result` (a benchmark run again in a fresh process, e.g. one
per measured model, and the JSON it printed), :func:`interleaved_rounds` (every variant measured in
every round), :func:`write_report` (a table printed and kept with its rows), :func:`synchronize`
(the device's queued work waited for around a timing), :func:`reset_peak` and :func:`release` (a
row's device memory counted from a clean start and handed back after it), :func:`rss_mb` (this
process's resident memory), :func:`one_line` (an error as a row records it) and :func:`prob` (a
dropout probability as a row names it). Their tables are written by
:mod:`transformer.analysis.markdown`; their pages are listed in ``docs/measuring.md``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from transformer.runs.io import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
"""The checkout the benchmarks belong to (its ``configs/``, ``scripts/`` and ``docs/benchmarks/``)."""


def git_commit(repo: Path = REPO) -> str:
    """The short commit of ``repo``'s working tree (``+ local changes`` when tracked files differ), or
    ``?`` outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        commit, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
        return (commit or "?") + (" + local changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``benchmarks.<module>`` with ``args`` in a fresh Python process (this
    interpreter; run it with ``cwd=REPO`` so that ``benchmarks`` is importable)."""
    return [sys.executable, "-m", f"benchmarks.{module}", *args]


def worker_result(cmd: list[str], timeout: float | None = None, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """Run ``cmd`` (a :func:`module_command`) in :data:`REPO` and read the JSON its last line of stdout
    holds: ``(result, "")``, or ``(None, why not)``: a timeout, unreadable output, or the last line of
    its stderr (its exit status when that is empty)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"worker timed out after {timeout} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1]), ""
        except json.JSONDecodeError:
            return None, f"unreadable worker output: {lines[-1][:200]}"
    err = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return None, err[-1] if err else f"worker exited with {proc.returncode}"


def interleaved_rounds(variants: Sequence[Any], rounds: int, run: Callable[[Any], dict]) -> list[dict]:
    """``run(variant)`` of every variant, ``rounds`` times, round ``r`` starting at variant ``r``: a
    shared machine's speed drifts by up to 2x within minutes, and measuring the variants one after
    another would turn that drift into false ratios. Each row gets its ``round``."""
    n = len(variants)
    return [{**run(variants[(r + j) % n]), "round": r} for r in range(rounds) for j in range(n)]


def write_report(out: Path | None, name: str, rows: Any, text: str) -> None:
    """Print ``text`` (a benchmark's Markdown); with ``out``, also write ``out/<name>.json`` (the measured
    rows) and ``out/<name>.md`` (the text), each atomically."""
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / f"{name}.json", json.dumps(rows, indent=1) + "\n")
        atomic_write_text(out / f"{name}.md", text)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Drop what the last row left: Python's garbage, and on CUDA the caching allocator's free blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> int:
    """:func:`release`, then on CUDA restart the count of ``torch.cuda.max_memory_allocated``; the bytes
    allocated now (0 on a CPU), what a row's peak is read above."""
    release(device)
    if device.type != "cuda":
        return 0
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def rss_mb() -> float:
    """This process's resident memory in MiB (``/proc/self/statm``)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_line(err: BaseException, limit: int = 400) -> str:
    """``Type: message`` on one line (whitespace runs joined), cut to ``limit`` characters: an error
    as a row records it."""
    return " ".join(f"{type(err).__name__}: {err}".split())[:limit]


def prob(x: float) -> str:
    """A probability as a row names it (``"0.1"``)."""
    return repr(float(x))
