"""Analysis of sweeps: comparison tables, CSVs, significance tests and plots (scripts/compare.py).

Where things are: :mod:`.collect` (run folders of a sweep, read into :class:`Run`), :mod:`.grouping`
(runs -> :class:`Configuration` by config, labels), :mod:`.comparability` (runs that may share a
table: the same recipe but for the switches and the seed), :mod:`.bootstrap` (the paired bootstrap
over test sentences and seeds), :mod:`.stats` (means over seeds, significance against the baseline),
:mod:`.length` (test BLEU / chrF by bucket of reference length), :mod:`.compare`
(:func:`compare_sweeps` -> :class:`Comparison`), :mod:`.plots`, :mod:`.length_report` (the length
sections' markdown and CSV) and :mod:`.report` (markdown, CSV, PNG outputs; :func:`compare_and_write`,
the work of ``scripts/compare.py``). Imports go down that list
only. matplotlib (the ``plots`` extra) is imported only when a plot is made.
"""

from transformer.analysis.collect import Run, expected_jobs, find_run_dirs, load_run
from transformer.analysis.comparability import MixedField, MixedRunsError, mixed_fields
from transformer.analysis.compare import UNTRAINED_BELOW, Comparison, compare_sweeps, describe_machine, significant
from transformer.analysis.grouping import IGNORED_KEYS, Configuration, group_runs
from transformer.analysis.length import DEFAULT_BUCKETS, Bucket, LengthTable, length_table, parse_buckets
from transformer.analysis.plots import (
    PlotsUnavailable,
    bleu_bars_figure,
    bleu_by_length_figure,
    matplotlib_missing,
    plot_bleu_bars,
    plot_bleu_by_length,
    plot_validation_curves,
    validation_curves_figure,
)
from transformer.analysis.report import (
    NoFinishedRun,
    compare_and_write,
    length_markdown,
    to_markdown,
    write_csv,
    write_length_csv,
    write_outputs,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "IGNORED_KEYS",
    "UNTRAINED_BELOW",
    "Bucket",
    "Comparison",
    "Configuration",
    "LengthTable",
    "MixedField",
    "MixedRunsError",
    "NoFinishedRun",
    "PlotsUnavailable",
    "Run",
    "bleu_bars_figure",
    "bleu_by_length_figure",
    "compare_and_write",
    "compare_sweeps",
    "describe_machine",
    "expected_jobs",
    "find_run_dirs",
    "group_runs",
    "length_markdown",
    "length_table",
    "load_run",
    "matplotlib_missing",
    "mixed_fields",
    "parse_buckets",
    "plot_bleu_bars",
    "plot_bleu_by_length",
    "plot_validation_curves",
    "significant",
    "to_markdown",
    "validation_curves_figure",
    "write_csv",
    "write_length_csv",
    "write_outputs",
]
