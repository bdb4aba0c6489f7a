"""The outputs of a comparison: markdown table, CSVs, and the plots (:mod:`transformer.analysis.plots`);
:func:`compare_and_write` is the work of ``scripts/compare.py``."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path

from transformer.analysis.collect import Run
from transformer.analysis.compare import (
    ALPHA,
    CSV_COLUMNS,
    UNTRAINED_BELOW,
    Comparison,
    compare_sweeps,
    describe_machine,
)
from transformer.analysis.length import DEFAULT_BUCKETS, Bucket
from transformer.analysis.length_report import length_markdown, write_length_csv, write_rows
from transformer.analysis.markdown import row, rule
from transformer.analysis.plots import matplotlib_missing, plot_bleu_bars, plot_bleu_by_length, plot_validation_curves

__all__ = [
    "NoFinishedRun",
    "compare_and_write",
    "length_markdown",
    "to_markdown",
    "write_csv",
    "write_length_csv",
    "write_outputs",
]


class NoFinishedRun(RuntimeError):
    """No run of the sweeps has results (the outputs list the runs without results)."""


def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.2f}{suffix}{unit}"
    return f"{value:.0f}{unit}" if float(value).is_integer() else f"{value:.2f}{unit}"


def _params(row: dict) -> str:
    """Total parameters, and the active ones per token where they differ (a mixture of experts)."""
    total, active = row["params"], row.get("active_params")
    return _si(total) if active is None or active == total else f"{_si(total)} ({_si(active)} active)"


def _pm(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def _p_cell(p: float | None, significant: bool | None, within_noise: bool | None, missing: str) -> str:
    """An adjusted p-value: ``*`` when significant, `` †`` when under :data:`ALPHA` but the difference
    is within the noise floor (so not significant); ``missing`` without a p-value."""
    if p is None:
        return missing
    return f"{p:.4f}" + ("*" if significant else " †" if p < ALPHA and within_noise else "")


def _p(row: dict) -> str:
    if row["is_baseline"]:
        return "baseline"
    if row.get("untrained"):
        return "untrained"
    return _p_cell(row.get("p_value_holm"), row.get("significant"), row.get("within_noise"), "n/a")


def _p_prev(row: dict, above: dict | None) -> str:
    if above is None or row.get("delta_prev_bleu") is None:
        return ""
    if row.get("untrained") or above.get("untrained"):
        return "untrained"
    return _p_cell(row.get("p_value_prev_holm"), row.get("significant_prev"), row.get("within_noise_prev"), "")


def _delta(value: float | None, within_noise: bool | None) -> str:
    if value is None:
        return ""
    return f"{value:+.2f}" + (" ≈" if within_noise else "")


def _noise_line(c: Comparison) -> str:
    n = c.noise_floor or {}
    if not n:
        return ""
    if n.get("range") is None:
        return (
            f"Noise floor: not measured ({n.get('label')} has {n.get('n_seeds', 0)} seed(s); "
            "a second seed of the baseline gives its seed-to-seed spread)."
        )
    line = (
        f"Noise floor: {n['label']}'s test BLEU over {n['n_seeds']} seeds varies by {n['range']:.2f} "
        f"(max − min; std {n['std']:.2f}); a Δ marked ≈ is no larger than that."
    )
    if n.get("pooled_std") is not None and n.get("pooled_configs", 0) > 1:
        line += (
            f" Pooled over the {n['pooled_configs']} configurations with two or more seeds, the seed std "
            f"of test BLEU is {n['pooled_std']:.2f}."
        )
    return line


def _missing_line(run: Run) -> str:
    what = " ".join(
        o
        for o in run.overrides
        if not o.startswith(("data.", "model.", "train.", "generation.", "lr_scheduler.", "hydra."))
    )
    where = f"`{run.run_dir}`"
    return f"- {where}{f' ({what})' if what else ''}: {run.reason}"


def _unreferenced_line(c: Comparison) -> str:
    split = c.rows[0]["test_split"] if c.rows else "the test split"
    folders = ", ".join(f"`{d}`" for d in c.unreferenced)
    return (
        f"**No p-values where the references are missing**: the references of `{split}` are neither in "
        f"{folders} (`hyps/{split}.ref`: a run trained by an older version stores none) nor on "
        "this machine; set `TRANSFORMER_DATA_DIR` (or `data.root`) to the folder that holds the data "
        "(e.g. `TRANSFORMER_DATA_DIR=../shared/data`) and compare again."
    )


def to_markdown(comparison: Comparison, plots: Sequence[str] = ()) -> str:
    """The comparison as a markdown document: table, notes, BLEU by reference length and by source length
    (:func:`length_markdown`), runs without results, plots."""
    c = comparison
    lines = ["# Comparison", ""]
    if c.unreferenced:  # said first: a table without p-values reads as one without differences
        lines += [_unreferenced_line(c), ""]
    lines.append("Sweeps: " + ", ".join(f"`{d}`" for d in c.sweep_dirs))
    if c.rows:
        split = c.rows[0]["test_split"]
        lines.append(f"Test split: `{split}`; baseline: **{c.baseline}**.")
        for name, sig in c.signatures.items():
            lines.append(f"- {name} signature: `{sig}`")
        for machine in c.machines:
            lines.append(f"- trained on: {machine}")
    noise = _noise_line(c)
    if noise:
        lines.append(noise)
    lines.append("")
    prev = ["Δ prev", "p prev Holm"] if c.compare_prev else []
    header = [
        "Configuration",
        "Runs",
        "BLEU",
        "ΔBLEU",
        "p Holm",
        *prev,
        "chrF",
        "Params",
        "FLOPs/token",
        "KV-cache B/token",
        "Train tok/s",
        "Peak MB",
    ] + (["Differs in"] if c.mixed else [])
    lines += [
        row(header),
        rule("l" + "r" * (len(header) - 1 - bool(c.mixed)) + "l" * bool(c.mixed)),
    ]
    for i, r in enumerate(c.rows):
        mixed_machines = r.get("machines", 1) > 1
        mem = "mixed" if mixed_machines else "n/a" if r["peak_memory_mb"] is None else f"{r['peak_memory_mb']:.0f}"
        above = c.rows[i - 1] if i else None
        prev_cells = (
            [_delta(r.get("delta_prev_bleu"), r.get("within_noise_prev")), _p_prev(r, above)] if c.compare_prev else []
        )
        lines.append(
            row(
                [
                    f"{r['label']}{' (baseline)' if r['is_baseline'] else ''}{' (untrained)' if r.get('untrained') else ''}",
                    f"{r['n_runs']}/{r['n_runs'] + r['n_missing']}",
                    _pm(r["bleu_mean"], r["bleu_std"]),
                    _delta(r["delta_bleu"], r.get("within_noise")),
                    _p(r),
                    *prev_cells,
                    _pm(r["chrf_mean"], r["chrf_std"]),
                    _params(r),
                    _si(r["flops_per_token"]),
                    _si(r["kv_cache_bytes_per_token"]),
                    "mixed" if mixed_machines else _si(r["train_tokens_per_s"]),
                    mem,
                ]
                + ([r.get("mixed") or ""] if c.mixed else [])
            )
        )
    lines += [
        "",
        "BLEU and chrF: mean ± sample standard deviation over seeds (Runs: finished/all). "
        f"p Holm: paired bootstrap ({c.n_bootstrap} resamples) of the test hypotheses against the baseline's "
        "that draws both the test sentences and each configuration's seeds, so that it counts the seed-to-seed "
        "variation (Clark et al. 2011; with one seed each, sacreBLEU's paired bootstrap; each seed pair's own "
        "p-value is in comparison.csv's p_value_seeds), then Holm-Bonferroni adjusted over all the comparisons "
        "of this table (* adjusted p < 0.05 and the Δ larger than the noise floor; a Δ marked ≈ is within the "
        "seed noise and never starred, its p marked † where under 0.05; the unadjusted p-values are in "
        f"comparison.csv). A configuration whose mean BLEU is under {c.untrained_below:g} is untrained: its "
        "comparisons are left out of the adjustment. "
        + (
            "Δ prev / p prev Holm: the same against the row above (the switch this row adds, in a ladder). "
            if c.compare_prev
            else "No comparison with the row above (--no-prev): the comparisons are each "
            "configuration against the baseline. "
        )
        + "FLOPs/token: forward matmul FLOPs per target token (16-token sentences); "
        "KV-cache: fp32 bytes per generated token over all decoder layers.",
    ]
    if any(r.get("active_params") not in (None, r["params"]) for r in c.rows):
        lines[-1] += (
            " Params: all the model's parameters, and (active) those one token uses: in a "
            "mixture of experts top_k of its routed experts, the router and any shared experts."
        )
    if c.notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in c.notes]
    if c.length is not None and c.rows:
        lines += ["", *length_markdown(c.length)]
    if c.source_length is not None and c.rows:
        lines += ["", *length_markdown(c.source_length)]
    lines += ["", f"## Runs without results ({len(c.missing)})", ""]
    lines += [_missing_line(r) for r in c.missing] or ["None: every run finished."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def write_csv(comparison: Comparison, path: str | Path) -> Path:
    """``comparison.csv`` at ``path``: one row per configuration (:data:`CSV_COLUMNS`); and
    ``runs.csv`` beside it: one row per run, finished (``status`` ok, its scores) or without results
    (``status`` missing, the reason)."""
    path = write_rows(Path(path), CSV_COLUMNS, comparison.rows)
    runs_path = path.with_name("runs.csv")
    with runs_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "configuration",
                "seed",
                "status",
                "bleu",
                "chrf",
                "updates",
                "run_dir",
                "reason",
                "train_tokens_per_s",
                "peak_memory_mb",
                "machine",
            ]
        )
        for c in comparison.configurations:
            for r in c.runs:
                w.writerow(
                    [
                        c.label,
                        r.seed,
                        "ok",
                        r.results["bleu"],
                        r.results.get("chrf"),
                        r.results.get("updates"),
                        r.run_dir,
                        "",
                        r.results.get("train_tokens_per_s"),
                        r.results.get("peak_memory_mb"),
                        describe_machine(r.results),
                    ]
                )
        labels = {id(r): c.label for c in comparison.configurations for r in c.missing}
        for r in comparison.missing:
            w.writerow([labels.get(id(r), ""), r.seed, "missing", "", "", "", r.run_dir, r.reason, "", "", ""])
    return path


def write_outputs(comparison: Comparison, out_dir: str | Path, *, plots: bool | None = None) -> dict[str, Path]:
    """Write ``comparison.md``, ``comparison.csv``, ``runs.csv``, ``valid_curves.png`` and
    ``bleu_bars.png`` into ``out_dir`` (created), and with a length table (:attr:`Comparison.length`)
    ``length_buckets.csv`` and ``bleu_by_length.png``, with a source-length table
    (:attr:`Comparison.source_length`) ``source_length_buckets.csv``.

    Args:
        comparison: the result of :func:`~transformer.analysis.compare.compare_sweeps`.
        out_dir: the folder to write into.
        plots: draw the PNGs (True), leave them out (False), or draw them when matplotlib is
            installed (None, :func:`~transformer.analysis.plots.matplotlib_missing`); without
            plots the markdown has no Plots section.

    Returns:
        ``{"valid_curves", "bleu_bars", "bleu_by_length", "csv", "runs_csv", "length_csv",
        "source_length_csv", "markdown"}`` -> path, in that order (plots only when drawn, and only when some configuration finished;
        the length files only with a length table that has rows).

    Raises:
        PlotsUnavailable: ``plots=True`` without matplotlib (nothing is written).
    """
    if plots is None:
        plots = matplotlib_missing() is None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    length = comparison.length if comparison.rows and comparison.length is not None and comparison.length.rows else None
    if comparison.rows and plots:
        paths["valid_curves"] = plot_validation_curves(comparison, out / "valid_curves.png")
        paths["bleu_bars"] = plot_bleu_bars(comparison, out / "bleu_bars.png")
        if length is not None:
            paths["bleu_by_length"] = plot_bleu_by_length(comparison, out / "bleu_by_length.png")
    paths["csv"] = write_csv(comparison, out / "comparison.csv")
    paths["runs_csv"] = out / "runs.csv"
    if length is not None:
        paths["length_csv"] = write_length_csv(length, out / "length_buckets.csv")
    source = comparison.source_length
    if comparison.rows and source is not None and source.rows:
        paths["source_length_csv"] = write_length_csv(source, out / "source_length_buckets.csv")
    md = out / "comparison.md"
    drawn = [str(paths[k]) for k in ("valid_curves", "bleu_bars", "bleu_by_length") if k in paths]
    md.write_text(to_markdown(comparison, drawn), encoding="utf-8")
    paths["markdown"] = md
    return paths


def compare_and_write(
    sweep_dirs: Sequence[str | Path],
    out: str | Path | None = None,
    *,
    baseline: str | None = None,
    n_bootstrap: int = 1000,
    bootstrap_seed: int = 12345,
    allow_mixed: bool = False,
    compare_prev: bool = True,
    length_buckets: str | Sequence[Bucket] | None = DEFAULT_BUCKETS,
    length_splits: str | Sequence[str] | None = None,
    untrained_below: float = UNTRAINED_BELOW,
) -> dict[str, Path]:
    """What ``scripts/compare.py`` does: compare the runs of the sweeps, write the outputs, print
    the markdown on stdout and, on stderr, one ``wrote <name>: <path>`` line per file.

    Without matplotlib the tables are still written and printed, without plots (and without the
    markdown's Plots section), and one line ``warning: plots skipped: matplotlib is not installed
    (pip install -e ".[plots]")`` goes to stderr. Runs without results are listed in the outputs
    and counted in a ``warning: N run(s) without results`` line.

    Args:
        sweep_dirs: multirun folders (or run folders).
        out: the output folder; None: ``<first sweep>/comparison``.
        baseline, n_bootstrap, bootstrap_seed, allow_mixed, compare_prev, length_buckets, length_splits, untrained_below: see :func:`~transformer.analysis.compare.compare_sweeps`.

    Returns:
        The paths written (see :func:`write_outputs`).

    Raises:
        FileNotFoundError: a sweep folder that does not exist.
        ValueError: a baseline that matches no configuration, runs trained differently
            (:class:`~transformer.analysis.comparability.MixedRunsError`) without ``allow_mixed``,
            length buckets that are not ascending ranges, or length splits that no run has.
        NoFinishedRun: after the outputs were written, when no run has results.
    """
    sweep_dirs = [Path(d) for d in sweep_dirs]
    comparison = compare_sweeps(
        sweep_dirs,
        baseline=baseline,
        n_bootstrap=n_bootstrap,
        bootstrap_seed=bootstrap_seed,
        allow_mixed=allow_mixed,
        compare_prev=compare_prev,
        length_buckets=length_buckets,
        length_splits=length_splits,
        untrained_below=untrained_below,
    )
    skipped = matplotlib_missing() if comparison.rows else None
    paths = write_outputs(
        comparison, Path(out) if out is not None else sweep_dirs[0] / "comparison", plots=skipped is None
    )
    print(paths["markdown"].read_text(encoding="utf-8"))
    for name, path in paths.items():
        print(f"wrote {name}: {path}", file=sys.stderr)
    if skipped:
        print(f"warning: plots skipped: {skipped}", file=sys.stderr)
    if comparison.missing:
        print(f"warning: {len(comparison.missing)} run(s) without results (listed above)", file=sys.stderr)
    if comparison.unreferenced:
        print("warning: no p-values where the references are missing (the line at the top)", file=sys.stderr)
    if not comparison.rows:
        raise NoFinishedRun("no finished run found")
    return paths
