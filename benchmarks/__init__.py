"""The benchmarks: speed and memory of the zoo against its peers, each run from the repository's root
as ``python -m benchmarks.NAME`` on the installed package (``pip install -e .``).

Each module is one benchmark with its command line; what they share lives here:
:data:`REPO` (the checkout they measure), :func:`git_commit` (the commit a report names),
:func:`module_command` (a benchmark run again in a fresh process, e.g. one per measured model) and
:func:`write_report` (a table printed and kept with its rows). Their tables are written by
:mod:`transformer.analysis.markdown`; their pages are listed in ``docs/measuring.md``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from transformer.io import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
"""The checkout the benchmarks belong to (its ``configs/``, ``scripts/`` and ``docs/benchmarks/``)."""


def git_commit(repo: Path = REPO) -> str:
    """The short commit of ``repo``'s working tree (``+ local changes`` when tracked files differ), or
    ``?`` outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (commit or "?") + (" + local changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``benchmarks.<module>`` with ``args`` in a fresh Python process (this
    interpreter; run it with ``cwd=REPO`` so that ``benchmarks`` is importable)."""
    return [sys.executable, "-m", f"benchmarks.{module}", *args]


def write_report(out: Path | None, name: str, rows: list[dict[str, Any]], text: str) -> None:
    """Print ``text`` (a benchmark's Markdown); with ``out``, also write ``out/<name>.json`` (the measured
    rows) and ``out/<name>.md`` (the text), each atomically."""
    print(text)
    if out is not None:
        atomic_write_text(out / f"{name}.json", json.dumps(rows, indent=1) + "\n")
        atomic_write_text(out / f"{name}.md", text)
