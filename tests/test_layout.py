"""The repository's layout: small files (no Python file in ``transformer/`` or ``benchmarks/`` is
longer than :data:`MAX_LINES` lines, docs/contributing.md, "How the code is laid out"; a longer one
is split along a seam of what it does), and every test file that the pages, the code and the
scripts name exists.

The limit counts lines as ``ruff format`` (line length 120) lays them out: the formatter puts a long
call's arguments one per line, so the same code takes more lines than hand-wrapped code did (420
before the formatter; 500 after it: the files that stood near 420 come out near 500)."""

import re

from tests.conftest import REPO_ROOT

MAX_LINES = 500  # lines in the formatter's layout (ruff format writes long calls vertically)
FOLDERS = ("transformer", "benchmarks")


def _line_counts() -> dict[str, int]:
    """``{path relative to the repository: lines}`` of every ``.py`` file under :data:`FOLDERS`."""
    return {
        path.relative_to(REPO_ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in FOLDERS
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
    }


def test_the_counter_sees_the_files():
    counts = _line_counts()
    assert {
        "transformer/config/schema.py",
        "transformer/training/loop/trainer.py",
        "benchmarks/gpu_check/cli.py",
    } <= set(counts)
    assert all(n > 0 for n in counts.values())


def test_no_file_is_longer_than_the_limit():
    long = {path: n for path, n in _line_counts().items() if n > MAX_LINES}
    assert long == {}, f"files over {MAX_LINES} lines (split them along a seam): " + ", ".join(
        f"{path} ({n})" for path, n in sorted(long.items(), key=lambda item: -item[1])
    )


def test_every_test_file_named_exists():
    named: dict[str, set[str]] = {}
    files = [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")]
    for folder, pattern in (
        ("transformer", "*.py"),
        ("benchmarks", "*.py"),
        ("scripts", "*"),
        ("tests", "*.py"),
        ("configs", "*.yaml"),
        ("examples", "*"),
    ):
        files += [p for p in (REPO_ROOT / folder).rglob(pattern) if p.is_file()]
    for path in files:
        for name in re.findall(r"tests/[\w/]+\.py", path.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(name, set()).add(path.relative_to(REPO_ROOT).as_posix())
    assert "tests/benchmarks/test_gpu_check.py" in named
    missing = {name: sorted(where) for name, where in named.items() if not (REPO_ROOT / name).is_file()}
    assert missing == {}, f"test files named but not there: {missing}"
