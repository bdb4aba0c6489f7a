"""The length sections of a comparison's outputs: the markdown of a :class:`~transformer.analysis.length.LengthTable`
(``comparison.md``'s "BLEU by reference length" and "BLEU by source length") and its CSV
(``length_buckets.csv``, ``source_length_buckets.csv``)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

from transformer.analysis.length import LENGTH_COLUMNS, LengthTable
from transformer.analysis.markdown import row, rule

__all__ = ["length_markdown", "write_length_csv", "write_rows"]


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
    """The "BLEU by reference length" (or "by source length", :attr:`LengthTable.by`) section of
    ``comparison.md``: the buckets used, then BLEU,
    ΔBLEU against the baseline and chrF per configuration and bucket, with their intervals, and (with
    two buckets or more that hold sentences) each bucket's BLEU change from the shortest of them and
    that change against the baseline's."""
    by = table.by
    lines = [f"## BLEU by {by} length", ""]
    splits = ", ".join(f"`{s}`" for s in table.splits) + (" pooled" if len(table.splits) > 1 else "")
    outside = f", {table.n_outside} of them in no bucket" if table.n_outside else ""
    lines.append(
        f"Buckets of {by} length in words (whitespace-separated tokens of the detokenized {by}; "
        f"--length-buckets): {', '.join(b.label for b in table.buckets)}. Test sentences: {splits} "
        f"({sum(table.n_sentences) + table.n_outside} sentences{outside})."
    )
    if not table.rows:
        return [
            *lines,
            "",
            f"Not computed: no run's hypotheses and references{' and sources' if by == 'source' else ''} could be read.",
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
    return write_rows(Path(path), LENGTH_COLUMNS, table.rows)


def write_rows(path: Path, columns: Sequence[str], rows: Iterable[dict]) -> Path:
    """A CSV file of ``columns`` from dict ``rows`` (a missing or None value is written empty)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return path
