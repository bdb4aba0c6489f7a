"""The outputs of a comparison: markdown table, CSVs, and the plots (:mod:`transformer.analysis.plots`);
:func:`compare_and_write` is the work of ``scripts/compare.py``."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from transformer.analysis.collect import Run
from transformer.analysis.compare import CSV_COLUMNS, Comparison, compare_sweeps, describe_machine
from transformer.analysis.length import DEFAULT_BUCKETS, LENGTH_COLUMNS, Bucket, LengthTable
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


def _p(row: dict) -> str:
    if row["is_baseline"]:
        return "baseline"
    p = row.get("p_value_holm")
    if p is None:
        return "n/a"
    return f"{p:.4f}" + ("*" if p < 0.05 else "")


def _p_prev(row: dict) -> str:
    p = row.get("p_value_prev_holm")
    return "" if p is None else f"{p:.4f}" + ("*" if p < 0.05 else "")


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
    """The comparison as a markdown document: table, notes, BLEU by reference length (:func:`length_markdown`),
    runs without results, plots."""
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
    for r in c.rows:
        mixed_machines = r.get("machines", 1) > 1
        mem = "mixed" if mixed_machines else "n/a" if r["peak_memory_mb"] is None else f"{r['peak_memory_mb']:.0f}"
        prev_cells = (
            [_delta(r.get("delta_prev_bleu"), r.get("within_noise_prev")), _p_prev(r)] if c.compare_prev else []
        )
        lines.append(
            row(
                [
                    f"{r['label']}{' (baseline)' if r['is_baseline'] else ''}",
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
        f"p Holm: sacreBLEU paired bootstrap ({c.n_bootstrap} resamples) of the test hypotheses against the "
        "baseline's, per seed-matched pair of runs, the largest p over the pairs, then Holm-Bonferroni "
        "adjusted over all the comparisons of this table (* adjusted p < 0.05; the unadjusted p-values are "
        "in comparison.csv). "
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
    lines += ["", f"## Runs without results ({len(c.missing)})", ""]
    lines += [_missing_line(r) for r in c.missing] or ["None: every run finished."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def _score_ci(row: dict, key: str, ci: str, signed: bool = False) -> str:
    """``row[key]`` and its interval ``row[ci + "_ci_low"]``, ``..._ci_high``: ``45.12 [43.00, 47.30]``, or
    ``+0.88 [-0.50, +2.30]`` for a difference (`` *`` when its interval excludes 0)."""
    value, low, high = row.get(key), row.get(f"{ci}_ci_low"), row.get(f"{ci}_ci_high")
    if value is None:
        return "n/a"
    fmt = "{:+.2f}" if signed else "{:.2f}"
    if low is None:
        return fmt.format(value)
    mark = " *" if signed and (low > 0 or high < 0) else ""
    return f"{fmt.format(value)} [{fmt.format(low)}, {fmt.format(high)}]{mark}"


def length_markdown(table: LengthTable) -> list[str]:
    """The "BLEU by reference length" section of ``comparison.md``: the buckets used, then BLEU,
    ΔBLEU against the baseline and chrF per configuration and bucket, with their intervals, and (with
    two buckets or more that hold sentences) each bucket's BLEU change from the shortest of them and
    that change against the baseline's."""
    lines = ["## BLEU by reference length", ""]
    splits = ", ".join(f"`{s}`" for s in table.splits) + (" pooled" if len(table.splits) > 1 else "")
    outside = f", {table.n_outside} of them in no bucket" if table.n_outside else ""
    lines.append(
        f"Buckets of reference length in words (whitespace-separated tokens of the detokenized reference; "
        f"--length-buckets): {', '.join(b.label for b in table.buckets)}. Test sentences: {splits} "
        f"({sum(table.n_sentences) + table.n_outside} sentences{outside})."
    )
    if not table.rows:
        return [
            *lines,
            "",
            "Not computed: no run's hypotheses and references could be read.",
            *(f"- {n}" for n in table.notes),
        ]
    by_label: dict[str, list[dict]] = {}
    for r in table.rows:
        by_label.setdefault(r["label"], []).append(r)
    header = ["Configuration"] + [f"{b.label} (n={n})" for b, n in zip(table.buckets, table.n_sentences)]
    line = rule("l" + "r" * len(table.buckets))
    interval = " [95% interval]" if table.n_bootstrap else ""
    ref = table.reference
    first = None if ref is None else table.buckets[ref].label
    # (title, value key, interval key prefix, signed, the baseline's own row shown)
    tables = [
        ("BLEU", "bleu_mean", "bleu", False, True),
        ("ΔBLEU against the baseline", "delta_bleu", "delta_bleu", True, False),
        ("chrF", "chrf_mean", "chrf", False, True),
    ]
    if ref is not None:
        tables += [
            (
                f"BLEU change from the shortest bucket with sentences ({first}), how BLEU falls with length",
                "change_bleu",
                "change_bleu",
                True,
                True,
            ),
            (
                "That change against the baseline's (+: loses less with length than the baseline)",
                "delta_change_bleu",
                "delta_change_bleu",
                True,
                False,
            ),
        ]
    for title, key, ci, signed, with_baseline in tables:
        what = interval.replace("95%", "paired 95%") if signed and not with_baseline else interval
        lines += ["", f"{title}{what}:", "", row(header), line]
        for label, rows in by_label.items():
            if not with_baseline and rows[0]["is_baseline"]:
                continue
            name = f"{label}{' (baseline)' if rows[0]['is_baseline'] else ''}"
            cells = [_score_ci(r, key, ci, signed) for r in rows]
            if key.endswith("change_bleu"):  # nothing before the reference bucket, which reads "reference"
                cells = ["" if b < ref else "reference" if b == ref else cell for b, cell in enumerate(cells)]
            lines.append(row([name] + cells))
    lines += [
        "",
        "Corpus BLEU and chrF (sacreBLEU, the runs' tokenizer and case) of the bucket's sentences, mean over the "
        "configuration's seeds"
        + (
            f"; [low, high]: 95% bootstrap interval over {table.n_bootstrap} resamples of the bucket's sentences, the "
            "same resamples for every configuration and seed, so the Δ intervals are paired (* a difference's or "
            "change's interval excludes 0; not adjusted for the number of buckets). The intervals measure the sampling of test sentences, not "
            "the seed-to-seed noise."
            if table.n_bootstrap
            else "; no intervals (--bootstrap 0)."
        )
        + (
            f" The change from {first} words is a bucket's BLEU minus that bucket's"
            + (", whose sentences are resampled independently of it" if table.n_bootstrap else "")
            + f"; the change against the baseline's equals the bucket's ΔBLEU minus the {first} bucket's"
            + (", paired over the same resamples" if table.n_bootstrap else "")
            + "."
            if ref is not None
            else ""
        )
        + " Per-seed scores in length_buckets.csv.",
    ]
    lines += [f"- {name} signature: `{sig}`" for name, sig in table.signatures.items()]
    if table.notes:
        lines += ["", "Notes on the length table:"] + [f"- {n}" for n in table.notes]
    return lines


def write_length_csv(table: LengthTable, path: str | Path) -> Path:
    """``length_buckets.csv``: one row per configuration and bucket
    (:data:`~transformer.analysis.length.LENGTH_COLUMNS`)."""
    return _write_rows(Path(path), LENGTH_COLUMNS, table.rows)


def _write_rows(path: Path, columns: Sequence[str], rows: Iterable[dict]) -> Path:
    """A CSV file of ``columns`` from dict ``rows`` (a missing or None value is written empty)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return path


def write_csv(comparison: Comparison, path: str | Path) -> Path:
    """``comparison.csv`` at ``path``: one row per configuration (:data:`CSV_COLUMNS`); and
    ``runs.csv`` beside it: one row per run, finished (``status`` ok, its scores) or without results
    (``status`` missing, the reason)."""
    path = _write_rows(Path(path), CSV_COLUMNS, comparison.rows)
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
    ``length_buckets.csv`` and ``bleu_by_length.png``.

    Args:
        comparison: the result of :func:`~transformer.analysis.compare.compare_sweeps`.
        out_dir: the folder to write into.
        plots: draw the PNGs (True), leave them out (False), or draw them when matplotlib is
            installed (None, :func:`~transformer.analysis.plots.matplotlib_missing`); without
            plots the markdown has no Plots section.

    Returns:
        ``{"valid_curves", "bleu_bars", "bleu_by_length", "csv", "runs_csv", "length_csv", "markdown"}``
        -> path, in that order (plots only when drawn, and only when some configuration finished;
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
        baseline, n_bootstrap, bootstrap_seed, allow_mixed, compare_prev, length_buckets, length_splits:
            see :func:`~transformer.analysis.compare.compare_sweeps`.

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
