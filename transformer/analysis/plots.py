"""PNG plots of a :class:`~transformer.analysis.compare.Comparison`, built on
:class:`matplotlib.figure.Figure` (Agg canvas), not ``pyplot``, so no display is needed and a
notebook's backend is left alone. matplotlib is optional (the ``plots`` extra): without it every
plot raises :class:`PlotsUnavailable`, and :func:`matplotlib_missing` says so beforehand."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from transformer.analysis.compare import Comparison

if TYPE_CHECKING:  # matplotlib is optional (the plots extra); it is imported when a plot is made
    from matplotlib.figure import Figure

__all__ = [
    "PlotsUnavailable",
    "bleu_bars_figure",
    "bleu_by_length_figure",
    "matplotlib_missing",
    "plot_bleu_bars",
    "plot_bleu_by_length",
    "plot_validation_curves",
    "validation_curves_figure",
]

PLOTS_EXTRA = 'pip install -e ".[plots]"'
"""The install command that provides matplotlib (the ``plots`` extra of ``pyproject.toml``)."""


class PlotsUnavailable(ImportError):
    """matplotlib is not installed: the message names the ``pip install`` that provides it."""


def matplotlib_missing() -> str | None:
    """Why no plot can be made (the ``pip install`` named), or None when matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"matplotlib is not installed ({PLOTS_EXTRA})"
    return None


def _new_figure(width: float, height: float, ncols: int = 1):
    missing = matplotlib_missing()
    if missing is not None:
        raise PlotsUnavailable(missing)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _save_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (120 dpi) and return ``path`` as a :class:`~pathlib.Path`."""
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def validation_curves_figure(comparison: Comparison) -> Figure:
    """Validation NLL (and BLEU when logged) against updates, one colour per configuration: thin lines
    per seed, a thick line for their mean. Raises :class:`PlotsUnavailable` without matplotlib."""
    configs = comparison.configurations
    metrics = ["nll_loss"] if any(r.valid_curve("nll_loss") for c in configs for r in c.runs) else ["loss"]
    if any(r.valid_curve("bleu") for c in configs for r in c.runs):
        metrics.append("bleu")
    fig, axes = _new_figure(6.0 * len(metrics), 4.2, len(metrics))  # PlotsUnavailable without matplotlib
    from matplotlib.ticker import MaxNLocator

    for ax, metric in zip(axes, metrics):
        for color, c in zip(_colors(len(configs)), configs):
            by_update: dict[int, list[float]] = {}
            for r in c.runs:
                curve = r.valid_curve(metric)
                if curve:
                    ax.plot(*zip(*curve), color=color, alpha=0.3, linewidth=0.8)
                for u, v in curve:
                    by_update.setdefault(u, []).append(v)
            if by_update:
                xs = sorted(by_update)
                ys = [sum(by_update[u]) / len(by_update[u]) for u in xs]
                ax.plot(
                    xs,
                    ys,
                    color=color,
                    linewidth=2.0,
                    marker="o" if len(xs) < 20 else None,
                    markersize=3,
                    label=f"{c.label} (n={len(c.runs)})",
                )
        ax.set_xlabel("update")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(
            {"nll_loss": "validation NLL (nats/token)", "loss": "validation loss", "bleu": "validation BLEU"}[metric]
        )
        ax.grid(alpha=0.3)
    axes[0].set_title("Validation curves (thin: seeds, thick: mean)")
    if axes[0].get_legend_handles_labels()[0]:  # evaluation folders (scripts/evaluate.py) have no curves
        axes[0].legend(fontsize="small")
    return fig


def plot_validation_curves(comparison: Comparison, path: str | Path) -> Path:
    """Save :func:`validation_curves_figure` as a PNG at ``path`` (120 dpi) and return the path."""
    return _save_png(validation_curves_figure(comparison), path)


def bleu_bars_figure(comparison: Comparison) -> Figure:
    """Test BLEU per configuration: bar = mean over seeds, error bar = sample std, dots = seeds; the
    baseline hatched, the table's significant differences starred. Raises :class:`PlotsUnavailable`
    without matplotlib."""
    rows = comparison.rows
    fig, (ax,) = _new_figure(max(5.5, 1.1 * len(rows) + 1.5), 4.2)
    xs = list(range(len(rows)))
    means = [r["bleu_mean"] or 0.0 for r in rows]
    stds = [r["bleu_std"] or 0.0 for r in rows]
    colors = _colors(len(rows))
    bars = ax.bar(xs, means, yerr=stds, capsize=4, color=colors, edgecolor="black", linewidth=0.6)
    for bar, r in zip(bars, rows):
        if r["is_baseline"]:
            bar.set_hatch("//")
    for x, c in zip(xs, comparison.configurations):
        seeds = [run.results["bleu"] for run in c.runs]
        ax.scatter([x] * len(seeds), seeds, color="black", s=10, zorder=3)
    top = max((m + s for m, s in zip(means, stds)), default=0.0)
    for x, r in zip(xs, rows):
        significant = r.get("significant")
        mark = "" if significant is None else ("*" if significant else "ns")
        ax.text(
            x,
            means[x] + stds[x] + 0.02 * max(top, 1.0),
            f"{means[x]:.2f}{(' ' + mark) if mark else ''}",
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_xticks(xs, [r["label"] for r in rows], rotation=30, ha="right", fontsize="small")
    split = rows[0]["test_split"] if rows else ""
    ax.set_ylabel(f"test BLEU ({split})")
    ax.set_ylim(0, max(top * 1.15, 1.0))
    ax.set_title(
        f"Test BLEU, mean ± std over seeds\nbaseline hatched; * Holm p < 0.05 vs {comparison.baseline}",
        fontsize="medium",
    )
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_bleu_bars(comparison: Comparison, path: str | Path) -> Path:
    """Save :func:`bleu_bars_figure` as a PNG at ``path`` (120 dpi) and return the path."""
    return _save_png(bleu_bars_figure(comparison), path)


def bleu_by_length_figure(comparison: Comparison) -> Figure:
    """Test BLEU per reference-length bucket, one line per configuration (mean over seeds), error bars =
    the 95% bootstrap interval, the baseline dashed, lines shifted sideways so bars do not overlap.

    Raises:
        PlotsUnavailable: matplotlib is not installed.
        ValueError: the comparison has no length table.
    """
    table = comparison.length
    if table is None or not table.rows:
        raise ValueError("no length table in this comparison (compare_sweeps with length_buckets)")
    fig, (ax,) = _new_figure(max(6.0, 1.2 * len(table.buckets) + 2.0), 4.2)
    labels = list(dict.fromkeys(r["label"] for r in table.rows))
    position = {b.label: k for k, b in enumerate(table.buckets)}
    for i, (color, label) in enumerate(zip(_colors(len(labels)), labels)):
        rows = [r for r in table.rows if r["label"] == label and r["bleu_mean"] is not None]
        shift = 0.0 if len(labels) == 1 else 0.3 * (i / (len(labels) - 1) - 0.5)  # within +-0.15 of the bucket
        xs = [position[r["bucket"]] + shift for r in rows]
        ys = [r["bleu_mean"] for r in rows]
        err = [
            [y - (r["bleu_ci_low"] if r["bleu_ci_low"] is not None else y) for y, r in zip(ys, rows)],
            [(r["bleu_ci_high"] if r["bleu_ci_high"] is not None else y) - y for y, r in zip(ys, rows)],
        ]
        base = bool(rows) and rows[0]["is_baseline"]
        ax.errorbar(
            xs,
            ys,
            yerr=err,
            color=color,
            marker="o",
            markersize=4,
            capsize=3,
            linewidth=1.5,
            linestyle="--" if base else "-",
            label=f"{label}{' (baseline)' if base else ''}",
        )
    ax.set_xticks(
        range(len(table.buckets)),
        [f"{b.label}\n(n={n})" for b, n in zip(table.buckets, table.n_sentences)],
        fontsize="small",
    )
    ax.set_xlabel("reference length (words)")
    pooled = len(table.splits) > 1  # the split names go in the title, where a long list has room to wrap
    ax.set_ylabel(f"test BLEU ({len(table.splits)} test sets pooled)" if pooled else f"test BLEU ({table.splits[0]})")
    interval = f"95% bootstrap interval ({table.n_bootstrap} resamples)" if table.n_bootstrap else "no intervals"
    title = "Test BLEU by reference length, mean over seeds"
    if pooled:
        title += f"\n{', '.join(table.splits)}"
    ax.set_title(f"{title}\nbars: {interval}", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def plot_bleu_by_length(comparison: Comparison, path: str | Path) -> Path:
    """Save :func:`bleu_by_length_figure` as a PNG at ``path`` (120 dpi) and return the path."""
    return _save_png(bleu_by_length_figure(comparison), path)
