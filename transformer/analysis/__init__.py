"""Analysis of sweeps: comparison tables, CSVs, significance tests and plots (scripts/compare.py).

Where things are: :mod:`.runs` (run folders of a sweep, read into :class:`Run`), :mod:`.grouping`
(runs -> :class:`Configuration` by config, labels), :mod:`.comparability` (runs that may share a
table: the same recipe but for the switches and the seed), :mod:`.stats` (means over seeds, paired
bootstrap against the baseline), :mod:`.compare` (:func:`compare_sweeps` -> :class:`Comparison`),
:mod:`.plots` and :mod:`.report` (markdown, CSV, PNG outputs; :func:`compare_and_write`, the work of
``scripts/compare.py``). Imports go down that list only. matplotlib (the ``plots`` extra) is
imported only when a plot is made.
"""

from transformer.analysis.comparability import MixedField, MixedRunsError, mixed_fields
from transformer.analysis.compare import Comparison, compare_sweeps, describe_machine
from transformer.analysis.grouping import IGNORED_KEYS, Configuration, group_runs
from transformer.analysis.plots import (
    PlotsUnavailable,
    bleu_bars_figure,
    matplotlib_missing,
    plot_bleu_bars,
    plot_validation_curves,
    validation_curves_figure,
)
from transformer.analysis.report import NoFinishedRun, compare_and_write, to_markdown, write_csv, write_outputs
from transformer.analysis.runs import Run, expected_jobs, find_run_dirs, load_run

__all__ = [
    "IGNORED_KEYS",
    "Comparison",
    "Configuration",
    "MixedField",
    "MixedRunsError",
    "NoFinishedRun",
    "PlotsUnavailable",
    "Run",
    "bleu_bars_figure",
    "compare_and_write",
    "compare_sweeps",
    "describe_machine",
    "expected_jobs",
    "find_run_dirs",
    "group_runs",
    "load_run",
    "matplotlib_missing",
    "mixed_fields",
    "plot_bleu_bars",
    "plot_validation_curves",
    "to_markdown",
    "validation_curves_figure",
    "write_csv",
    "write_outputs",
]
