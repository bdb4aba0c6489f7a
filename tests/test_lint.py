"""The linter and the formatter hold over the repository: ``ruff check .`` (the rules of
``[tool.ruff.lint]`` in ``pyproject.toml``: unused and undefined names, shadowed builtins, mutable
defaults, loop variables captured by closures, bare excepts, import order) and ``ruff format --check .``
(``line-length`` 120) both pass. ruff is part of ``[dev]``, so a missing ruff fails here rather than
skipping: CI (``.ci/run``, the README's test command) runs both checks through this file."""

import subprocess
import sys

from tests.conftest import REPO_ROOT


def _ruff(*args: str) -> subprocess.CompletedProcess:
    """``python -m ruff <args>`` in the repository root (the environment's ruff, its pyproject.toml settings)."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_is_installed_with_dev():
    proc = _ruff("--version")
    assert proc.returncode == 0, f"ruff is missing: pip install -e '.[dev]' installs it ({proc.stderr.strip()})"


def test_ruff_check_finds_nothing():
    proc = _ruff("check", "--output-format", "concise", ".")
    assert proc.returncode == 0, "ruff check . (fix the code; a noqa only with its reason):\n" + proc.stdout[-6000:]


def test_ruff_format_would_change_nothing():
    proc = _ruff("format", "--check", ".")
    assert proc.returncode == 0, "ruff format --check . (run `ruff format <files>`):\n" + proc.stdout[-6000:]


def test_the_linter_sees_a_planted_defect(tmp_path):
    """The configured rules catch what they are there for: a mutable default and an unused import."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(x=[]):\n    return x\n", encoding="utf-8")
    proc = _ruff("check", "--output-format", "concise", "--config", str(REPO_ROOT / "pyproject.toml"), str(bad))
    assert proc.returncode == 1
    assert "F401" in proc.stdout and "B006" in proc.stdout, proc.stdout
