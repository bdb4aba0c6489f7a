"""transformer.analysis.report.compare_and_write (the work of scripts/compare.py) in-process, and the
optional matplotlib: without it the tables are still written and printed, with one warning line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.analysis.test_compare import corpus, make_run, sweep  # noqa: F401 (fixtures)
from tests.conftest import REPO_ROOT
from transformer.analysis import NoFinishedRun, PlotsUnavailable, compare_and_write, compare_sweeps, write_outputs
from transformer.analysis.plots import PLOTS_EXTRA, matplotlib_missing

TABLES = {"comparison.md", "comparison.csv", "runs.csv", "length_buckets.csv", "source_length_buckets.csv"}
PLOTS = {"valid_curves.png", "bleu_bars.png", "bleu_by_length.png"}


@pytest.fixture
def no_matplotlib(monkeypatch):
    """``import matplotlib`` fails as on a machine without it (a None entry in sys.modules)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_compare_and_write_prints_the_table_and_what_it_wrote(sweep, tmp_path, capsys):  # noqa: F811 (the fixture imported above)
    paths = compare_and_write([sweep], tmp_path / "out", n_bootstrap=20)
    assert {p.name for p in (tmp_path / "out").iterdir()} == TABLES | PLOTS
    out = capsys.readouterr()
    assert out.out == paths["markdown"].read_text(encoding="utf-8") + "\n"
    err = out.err.splitlines()
    written = ("valid_curves", "bleu_bars", "bleu_by_length", "csv", "runs_csv", "length_csv", "source_length_csv")
    assert err[:8] == [f"wrote {k}: {paths[k]}" for k in (*written, "markdown")]
    assert err[8:] == ["warning: 2 run(s) without results (listed above)"]


def test_the_default_output_folder_is_in_the_first_sweep(sweep, capsys):  # noqa: F811 (the fixture imported above)
    compare_and_write([sweep], n_bootstrap=0)
    assert {p.name for p in (sweep / "comparison").iterdir()} == TABLES | PLOTS


def test_no_finished_run_is_raised_after_the_outputs_are_written(tmp_path, corpus, capsys):  # noqa: F811
    make_run(tmp_path / "s" / "0", corpus, "step0_vaswani2017", 1, None, finished=False)
    with pytest.raises(NoFinishedRun, match="^no finished run found$"):
        compare_and_write([tmp_path / "s"], tmp_path / "out", n_bootstrap=0)
    assert {p.name for p in (tmp_path / "out").iterdir()} == TABLES - {
        "length_buckets.csv",
        "source_length_buckets.csv",
    }  # listing the unfinished run
    assert "## Runs without results (1)" in (tmp_path / "out" / "comparison.md").read_text()


def test_without_matplotlib_the_tables_are_written_with_one_warning(sweep, tmp_path, capsys, no_matplotlib):  # noqa: F811 (the fixture imported above)
    assert matplotlib_missing() == 'matplotlib is not installed (pip install -e ".[plots]")'
    paths = compare_and_write([sweep], tmp_path / "out", n_bootstrap=0)
    assert {p.name for p in (tmp_path / "out").iterdir()} == TABLES
    assert set(paths) == {"csv", "runs_csv", "length_csv", "source_length_csv", "markdown"}
    md = paths["markdown"].read_text(encoding="utf-8")
    assert "| step0_vaswani2017 (baseline) | 3/3 |" in md and "## Plots" not in md and ".png" not in md
    out = capsys.readouterr()
    assert out.out == md + "\n"
    warnings = [line for line in out.err.splitlines() if "plots" in line]
    assert warnings == ['warning: plots skipped: matplotlib is not installed (pip install -e ".[plots]")']


def test_asking_for_plots_without_matplotlib_names_the_extra(sweep, tmp_path, no_matplotlib):  # noqa: F811 (the fixture imported above)
    comparison = compare_sweeps([sweep], n_bootstrap=0)
    with pytest.raises(PlotsUnavailable, match=r'pip install -e "\.\[plots\]"'):
        write_outputs(comparison, tmp_path / "out", plots=True)
    assert set(write_outputs(comparison, tmp_path / "out2", plots=False)) == {
        "csv",
        "runs_csv",
        "length_csv",
        "source_length_csv",
        "markdown",
    }


def test_the_extra_the_message_names_provides_matplotlib():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert PLOTS_EXTRA == 'pip install -e ".[plots]"'
    for extra in ("plots", "dev"):
        assert any(r.startswith("matplotlib") for r in extras[extra]), extra


def test_the_script_without_matplotlib_exits_0_with_one_warning_line(sweep, tmp_path):  # noqa: F811 (the fixture imported above)
    """In a real process: ``scripts/compare.py`` with matplotlib hidden, as a user without [plots] runs it."""
    code = (
        "import sys, runpy; sys.modules['matplotlib'] = None; sys.argv = ['scripts/compare.py', *sys.argv[1:]]; "
        "runpy.run_path('scripts/compare.py', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(sweep), "--out", str(tmp_path / "out"), "--bootstrap", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "| step1_pre_ln | 3/4 |" in proc.stdout
    assert [line for line in proc.stderr.splitlines() if line.startswith("warning: plots")] == [
        'warning: plots skipped: matplotlib is not installed (pip install -e ".[plots]")'
    ]
    assert {p.name for p in (tmp_path / "out").iterdir()} == TABLES
