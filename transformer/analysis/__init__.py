"""Analysis of sweeps: comparison tables, CSVs, significance tests and plots (scripts/compare.py)."""

from transformer.analysis.compare import (
    IGNORED_KEYS,
    Comparison,
    Configuration,
    Run,
    compare_sweeps,
    expected_jobs,
    find_run_dirs,
    group_runs,
    load_run,
    to_markdown,
    write_csv,
    write_outputs,
)
from transformer.analysis.plots import (
    bleu_bars_figure,
    plot_bleu_bars,
    plot_validation_curves,
    validation_curves_figure,
)

__all__ = [
    "IGNORED_KEYS",
    "Comparison",
    "Configuration",
    "Run",
    "bleu_bars_figure",
    "compare_sweeps",
    "expected_jobs",
    "find_run_dirs",
    "group_runs",
    "load_run",
    "plot_bleu_bars",
    "plot_validation_curves",
    "to_markdown",
    "validation_curves_figure",
    "write_csv",
    "write_outputs",
]
