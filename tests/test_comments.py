"""Comments and docstrings say what the code does and why; issue numbers belong in commit messages
and ``docs/``: none in ``transformer/``, ``scripts/``, ``benchmarks/`` or ``tests/``."""

import re

from tests.conftest import REPO_ROOT

FOLDERS = ("transformer", "scripts", "benchmarks", "tests")

ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+\)|(?<![\w&/])#\d+\b|\bPR #?\d+")
"""An issue or pull request number as it is usually written (the examples below); not a colour
(``#1f77b4``) or an anchor (``page.md#3``)."""


def test_the_pattern_finds_issue_numbers_and_nothing_else():
    n = 44  # the examples' number is filled in, so that this file passes its own check
    found = [f"see issue {n}", f"Issue #{n} item 5", f"fixed (#{n})", f"as in #{n}", f"PR #{n}", f"PR {n}"]
    not_found = ["color='#1f77b4'", "x = 3  # 12 heads", "docs/page.md#2-sizes", "issues with the data"]
    assert all(ISSUE_NUMBER.search(s) for s in found)
    assert not any(ISSUE_NUMBER.search(s) for s in not_found)


def test_no_issue_numbers_in_the_code():
    hits = [
        f"{path.relative_to(REPO_ROOT)}:{i}: {line.strip()}"
        for folder in FOLDERS
        for pattern in ("*.py", "*.sh")
        for path in sorted((REPO_ROOT / folder).rglob(pattern))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert hits == [], "issue numbers in code (say what the code does and why instead):\n" + "\n".join(hits)
