"""The documentation site builds, and the README is a short map of it.

* ``mkdocs build --strict`` succeeds: ``mkdocs.yml`` turns every broken link, missing anchor,
  unresolved API reference (mkdocstrings) and page left out of the navigation into a warning, and
  strict mode makes a warning fail the build. No network is used (no plugin fetches anything).
* The README's own links (GitHub renders it; it is not part of the site) point at files that exist,
  and its anchors at headings that exist; it links every page of the site.
* The README's ladder table is the one ``scripts/compare.py`` wrote in
  ``docs/results/ladder/comparison.md``, row for row, and the numbers of the ladder table on the
  Studies page are that file's.
* The README says how to build and serve the site, ``site/`` is ignored by git, the ``[docs]`` extra
  is part of ``[dev]`` (what ``.ci/run`` installs), and the README stays short.

What the pages say about the code (commands, switch tables, defaults, measured numbers) is
checked by ``tests/test_readme.py``.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"
README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
COMPARISON = DOCS / "results" / "ladder" / "comparison.md"
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _nav_pages() -> list[str]:
    """The pages of ``mkdocs.yml``'s ``nav`` (its last section), in order."""
    text = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?(\S+\.md)\s*$", nav, flags=re.M)


def slugify(value: str, separator: str = "-") -> str:
    """A heading's anchor as Python-Markdown's ``toc`` extension makes it (MkDocs' default)."""
    value = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(rf"[{separator}\s]+", separator, value)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    try:  # a failure, not a skip: [dev] installs them (named one by one for tests/test_dependencies.py)
        importlib.import_module("mkdocs")
        importlib.import_module("material")  # mkdocs-material
        importlib.import_module("mkdocstrings")
        importlib.import_module("mkdocstrings_handlers.python")  # mkdocstrings-python
    except ImportError as err:
        raise AssertionError(f"{err.name} is not installed: pip install -e '.[docs]'") from err
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO_ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + (
        "\n".join(warnings) or output[-3000:]
    )
    for page in ("index.html", "switches/index.html", "api/index.html", "results/ladder/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_every_page_of_docs_is_in_the_nav_and_every_nav_entry_exists():
    """(The strict build checks this too; here it fails with the page's name and nothing else.)"""
    nav = _nav_pages()
    assert "index.md" in nav and "api.md" in nav, nav
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert missing == [], f"mkdocs.yml's nav names pages that do not exist: {missing}"
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - set(nav) == set(), f"pages under docs/ that the nav leaves out: {sorted(pages - set(nav))}"


def _anchors(markdown_file: Path) -> set[str]:
    """The heading anchors of a Markdown file as the site's ``toc`` extension makes them."""
    text = markdown_file.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)
    return {slugify(re.sub(r"[`*]", "", h)) for h in headings}


def test_the_readme_links_point_at_files_and_headings_that_exist():
    problems = []
    for target in _LINK.findall(README):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = REPO_ROOT / path if path else REPO_ROOT / "README.md"
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            problems.append(f"{target}: {path} has no heading #{anchor}")
    assert problems == [], "\n".join(problems)


def test_the_readme_maps_every_page_of_the_site():
    linked = {t.partition("#")[0] for t in _LINK.findall(README)}
    pages = [p for p in _nav_pages() if "/" not in p and p != "index.md"]
    missing = [p for p in pages if f"docs/{p}" not in linked]
    assert missing == [], f"the README's map of the docs does not link {missing}"


def _table(text: str, header_start: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_readme_ladder_table_is_the_one_compare_py_wrote():
    committed = _table(COMPARISON.read_text(encoding="utf-8"), "| Configuration |")
    assert _table(README, "| Configuration |") == committed, (
        "the README's ladder table differs from docs/results/ladder/comparison.md's: copy it from there"
    )


def test_the_studies_ladder_table_holds_the_committed_numbers():
    committed = {
        row.split("|")[1].strip().split()[0].split("_")[0]: row
        for row in _table(COMPARISON.read_text(encoding="utf-8"), "| Configuration |")[2:]
    }
    rows = _table((DOCS / "studies.md").read_text(encoding="utf-8"), "| ladder step |")[2:]
    assert len(rows) == len(committed) == 7
    for row in rows:
        step = row.split("|")[1].strip().split(":")[0]
        numbers = re.findall(r"\d+\.\d+", row.replace("**", ""))
        absent = [n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", committed[step])]
        assert absent == [], f"studies.md's {step} row has {absent}, which comparison.md's {step} row does not"


def test_the_readme_says_how_to_build_and_serve_the_site():
    assert "mkdocs build --strict" in README and "mkdocs serve" in README
    assert "site/" in (REPO_ROOT / ".gitignore").read_text().splitlines()


_OUTPUT = re.compile(
    r"(?:(?<![\w.])out|output_dir|hydra\.run\.dir|hydra\.sweep\.dir)=([\w./-]+)|--out(?:put)? ([\w./-]+)"
)
"""The output of a command: ``out=``, ``output_dir=``, ``hydra.run.dir=``, ``hydra.sweep.dir=``, ``--out``,
``--output``."""


def test_the_output_folders_the_docs_use_are_ignored_by_git():
    """What a command of the README or a page writes inside the checkout (``outputs/``, ``runs/``,
    ``exports/``, ...) is never shown by ``git status`` (the result pages' commands write the files they
    commit, under ``docs/``)."""
    pages = [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    written = set()
    for page in pages:
        for block in re.findall(r"^```(?:bash|sh)?\n(.*?)^```$", page.read_text(encoding="utf-8"), flags=re.M | re.S):
            for found in _OUTPUT.finditer(block):
                path = next(g for g in found.groups() if g)
                if not path.startswith(("/", "..", "docs/")) and not path.split("/")[0].isupper():
                    written.add(path)
    assert {"outputs/my_run", "exports/run_hf", "runs/ladder/comparison"} <= written
    shown = [
        p
        for p in sorted(written)
        if subprocess.run(["git", "check-ignore", "-q", "--no-index", p], cwd=REPO_ROOT).returncode != 0
    ]
    assert shown == [], "outputs of the docs' commands that .gitignore does not ignore"


def test_the_docs_extra_is_installed_by_dev():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["docs"] and set(extras["docs"]) <= set(extras["dev"])


def test_the_readme_stays_a_short_map_and_no_table_row_is_a_page():
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail to a page under docs/"
    pages = [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    long_rows = [
        f"{p.name}: {len(line)} characters: {line[:60]}"
        for p in pages
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.startswith("|") and len(line) > 500
    ]
    assert long_rows == [], "table rows over 500 characters (split the row or move the prose below the table):\n" + (
        "\n".join(long_rows)
    )


@pytest.mark.parametrize("page", ["studies.md", "index.md"])
def test_every_experiment_and_every_committed_result_is_named_on_the_page(page):
    """A new ``configs/experiment/*.yaml`` or ``docs/results/*/`` folder shows on the studies page and
    the index (as ``experiment=<name>`` and as a link to the folder), so that neither lists only
    the studies that existed when it was written."""
    text = (DOCS / page).read_text(encoding="utf-8")
    links = {t.partition("#")[0] for t in _LINK.findall(text)}
    experiments = sorted(p.stem for p in (REPO_ROOT / "configs" / "experiment").glob("*.yaml"))
    results = sorted(p.name for p in (DOCS / "results").iterdir() if p.is_dir())
    unnamed = [f"experiment={e}" for e in experiments if not re.search(rf"experiment={e}\b", text)]
    unlinked = [f"docs/results/{r}/" for r in results if not any(t.startswith(f"results/{r}/") for t in links)]
    assert unnamed == [] and unlinked == [], f"docs/{page} does not name {unnamed + unlinked}"


def test_the_studies_page_says_which_studies_have_committed_runs():
    """Status prose that once went stale ("no results are committed yet" beside six committed runs)."""
    text = (DOCS / "studies.md").read_text(encoding="utf-8")
    for study in sorted(p.name for p in (DOCS / "results").iterdir() if (p / "runs").is_dir()):
        runs = [p for p in (DOCS / "results" / study / "runs").iterdir() if (p / "results.json").is_file()]
        assert runs, f"docs/results/{study}/runs holds no finished run"
        assert f"docs/results/{study}/runs" in text, f"docs/studies.md does not say where {study}'s committed runs are"
    assert "no results are committed" not in " ".join(text.split())
