"""Test BLEU and chrF by reference or source length: the bucketed analysis of compare-mt (Neubig et
al. 2019), with paired 95% bootstrap intervals (Koehn 2004) from sacreBLEU's sentence statistics.

A sentence's length is the number of whitespace-separated words of its detokenized reference (or
source, ``by="source"``). ``change_bleu`` is a bucket's BLEU minus that of the shortest bucket that
holds sentences (a stratified bootstrap); ``delta_change_bleu`` compares that change with the
baseline's, paired. How to read both: docs/studies.md#comparing-runs-comparepy."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from transformer.analysis.collect import Run, natural_key
from transformer.analysis.grouping import Configuration
from transformer.analysis.stats import mean, references, sources
from transformer.evaluation.metrics import scorers

__all__ = [
    "CHANGE_COLUMNS",
    "DEFAULT_BUCKETS",
    "LENGTH_COLUMNS",
    "Bucket",
    "LengthTable",
    "bucket_indices",
    "length_table",
    "parse_buckets",
    "reference_length",
]

DEFAULT_BUCKETS = "1-10,11-15,16-20,21-30,31+"
"""The default buckets of reference length in words (``--length-buckets``)."""

CHANGE_COLUMNS = (
    "change_bleu",
    "change_bleu_ci_low",
    "change_bleu_ci_high",
    "delta_change_bleu",
    "delta_change_bleu_ci_low",
    "delta_change_bleu_ci_high",
)
"""The change-with-length columns of ``length_buckets.csv`` (module docstring)."""

LENGTH_COLUMNS = (
    "label",
    "is_baseline",
    "bucket",
    "min_words",
    "max_words",
    "n_sentences",
    "n_runs",
    "seeds",
    "test_splits",
    "bleu_mean",
    "bleu_ci_low",
    "bleu_ci_high",
    "bleu_seeds",
    "delta_bleu",
    "delta_bleu_ci_low",
    "delta_bleu_ci_high",
    "chrf_mean",
    "chrf_ci_low",
    "chrf_ci_high",
    "delta_chrf",
    "delta_chrf_ci_low",
    "delta_chrf_ci_high",
    "n_bootstrap",
    *CHANGE_COLUMNS,
)
"""The columns of ``length_buckets.csv``, one row per configuration and bucket."""

METRICS = ("bleu", "chrf")
_PART = re.compile(r"(\d+)(?:-(\d+)|(\+))?")


@dataclass(frozen=True)
class Bucket:
    """Reference lengths from ``low`` to ``high`` words, both included; ``high`` None: no upper end."""

    low: int
    high: int | None = None

    @property
    def label(self) -> str:
        """``1-10``, ``31+``, or ``7`` for a one-length bucket."""
        if self.high is None:
            return f"{self.low}+"
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"

    def holds(self, length: int) -> bool:
        """Whether a reference of ``length`` words falls in this bucket."""
        return length >= self.low and (self.high is None or length <= self.high)


def parse_buckets(spec: str | Sequence[Bucket]) -> list[Bucket]:
    """Buckets from ``LOW-HIGH``, ``LOW+`` (no upper end, last only) or ``N`` parts joined by commas.

    Args:
        spec: e.g. ``"1-10,11-15,16-20,21-30,31+"`` (:data:`DEFAULT_BUCKETS`), or buckets to check.

    Returns:
        The buckets, ascending. Gaps are allowed (their sentences are counted in no bucket).

    Raises:
        ValueError: one line naming the part at fault: not a range of words, a range that ends before
            it starts, an open bucket that is not the last, or buckets not ascending or overlapping.
    """
    text = spec if isinstance(spec, str) else ",".join(b.label for b in spec)

    def error(why: str) -> ValueError:
        return ValueError(
            f"length buckets {text!r}: {why} (e.g. {DEFAULT_BUCKETS}: ranges of reference words, "
            "ascending, not overlapping, only the last open)"
        )

    if not isinstance(spec, str):
        buckets = list(spec)
    else:
        parts = [p.replace(" ", "") for p in spec.split(",")]
        if parts == [""]:
            raise error("no bucket given")
        buckets = []
        for part in parts:
            m = _PART.fullmatch(part)
            if m is None:
                raise error(f"{part!r} is not LOW-HIGH, LOW+ or N words")
            low = int(m.group(1))
            buckets.append(Bucket(low, None if m.group(3) else int(m.group(2) or low)))
    for i, b in enumerate(buckets):
        if b.high is not None and b.high < b.low:
            raise error(f"{b.low}-{b.high} ends before it starts")
        if b.high is None and i < len(buckets) - 1:
            raise error(f"{b.label} has no upper end, so it must be the last bucket")
        if i and b.low <= buckets[i - 1].high:
            raise error(
                f"{b.label} starts at or below {buckets[i - 1].high}, where {buckets[i - 1].label} ends, "
                "so the buckets are not ascending or they overlap"
            )
    return buckets


def reference_length(reference: str) -> int:
    """Length of a detokenized reference in words: its whitespace-separated tokens."""
    return len(reference.split())


def bucket_indices(refs: Sequence[str], buckets: Sequence[Bucket]) -> tuple[list[list[int]], int]:
    """The sentence indices of each bucket (by :func:`reference_length`), and how many fall in none."""
    out: list[list[int]] = [[] for _ in buckets]
    outside = 0
    for i, ref in enumerate(refs):
        n = reference_length(ref)
        b = next((k for k, bucket in enumerate(buckets) if bucket.holds(n)), None)
        if b is None:
            outside += 1
        else:
            out[b].append(i)
    return out, outside


@dataclass
class LengthTable:
    """Test scores by length bucket (:func:`length_table`).

    Attributes:
        splits: the test splits pooled (their sentences concatenated, in this order).
        n_sentences: sentences per bucket (the same for every configuration).
        n_outside: sentences in no bucket (a gap, or a reference of 0 words).
        rows: :data:`LENGTH_COLUMNS` dicts per configuration and bucket; scores in 0-100, None where
            not computed.
        n_bootstrap: resamples per bucket (0: no intervals).
        notes: sentences about runs left out or splits not pooled.
        reference: index of the bucket changes are taken from; None when fewer than two hold sentences.
        by: ``reference`` or ``source``.
    """

    buckets: list[Bucket]
    splits: list[str]
    n_sentences: list[int] = field(default_factory=list)
    n_outside: int = 0
    rows: list[dict] = field(default_factory=list)
    n_bootstrap: int = 0
    signatures: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reference: int | None = None
    by: str = "reference"


def _scored_splits(run: Run) -> set[str]:
    """The test splits a run has scores and hypotheses for (``results["test"]``; else its own split)."""
    test = (run.results or {}).get("test")
    names = [k for k, v in test.items() if isinstance(v, dict) and "bleu" in v] if isinstance(test, dict) else []
    return {s for s in names or [run.test_split] if s and run.hyps_path(s) is not None}


def _resolve_splits(runs: list[Run], base: Run, splits: str | Sequence[str] | None, notes: list[str]) -> list[str]:
    """The test splits to pool: the baseline's own, ``all`` (those every run has), or the ones named.

    Raises:
        ValueError: ``all`` mixed with names or with no common split, or a split no run has.
    """
    if splits is None:
        return [base.test_split]
    names = [s.strip() for s in (splits.split(",") if isinstance(splits, str) else splits) if s.strip()]
    have = [_scored_splits(r) for r in runs]
    union = set().union(*have)
    if "all" in names:
        if names != ["all"]:
            raise ValueError(f"length splits {splits!r}: 'all' pools every test split, name no other")
        common = set.intersection(*have)
        if not common:
            raise ValueError(f"length splits {splits!r}: no test split has hypotheses in every run")
        if union - common:
            left = ", ".join(sorted(union - common, key=natural_key))
            notes.append(f"test splits not scored by every run, not pooled: {left}")
        return sorted(common, key=natural_key)
    if not names:
        raise ValueError(f"length splits {splits!r}: no split named (e.g. all, or test_2016_flickr,test_2017_flickr)")
    unknown = [s for s in names if s not in union]
    if unknown:
        raise ValueError(
            f"length splits {splits!r}: no run has hypotheses for {', '.join(unknown)}; "
            f"the runs' test splits: {', '.join(sorted(union, key=natural_key))}"
        )
    return names


def _pooled(run: Run, splits: Sequence[str], with_sources: bool = False) -> tuple[list[str], list[str], list[str]]:
    """A run's hypotheses, references and (``with_sources``) sources of ``splits``, concatenated in
    that order (no sources: an empty list).

    Raises:
        ValueError: a split without hypotheses, or not as many hypotheses as references or sources.
        DataError: references or sources not on this machine (a ``ValueError`` too).
        OSError: a file that cannot be read.
    """
    hyps: list[str] = []
    refs: list[str] = []
    srcs: list[str] = []
    for split in splits:
        path = run.hyps_path(split)
        if path is None:
            raise ValueError(f"no hypotheses of {split}")
        h, r = path.read_text(encoding="utf-8").splitlines(), references(run, split)
        if len(h) != len(r):
            raise ValueError(f"{len(h)} hypotheses but {len(r)} references in {split}")
        if with_sources:
            src = sources(run, split)
            if len(src) != len(r):
                raise ValueError(f"{len(src)} sources but {len(r)} references in {split}")
            srcs += src
        hyps += h
        refs += r
    return hyps, refs, srcs


def _interval(values: np.ndarray) -> tuple[float, float]:
    """95% percentile interval of bootstrap values: the 2.5% and 97.5% order statistics, as sacreBLEU's
    ``estimate_ci`` takes them (index ``n // 40`` from each end)."""
    s = np.sort(values)
    k = len(s) // 40
    return float(s[k]), float(s[len(s) - k - 1])


def _resample_counts(rng: np.random.Generator, n: int, n_samples: int) -> np.ndarray:
    """``[n_samples, n]`` counts: how often each sentence is drawn in each resample of n with replacement."""
    idx = rng.integers(0, n, size=(n_samples, n))
    counts = np.zeros((n_samples, n))
    np.add.at(counts, (np.arange(n_samples)[:, None], idx), 1)
    return counts


def length_table(
    configs: list[Configuration],
    baseline: Configuration,
    buckets: Sequence[Bucket],
    splits: str | Sequence[str] | None = None,
    n_bootstrap: int = 1000,
    seed: int = 12345,
    by: str = "reference",
) -> LengthTable:
    """Test BLEU and chrF of every configuration per length bucket, against ``baseline``.

    Args:
        configs: in display order (their finished runs are scored).
        splits: None: the baseline's test split; ``"all"``: every test split all runs have hypotheses
            for; names (a list, or joined by commas): those splits, pooled in that order.
        n_bootstrap: resamples of each bucket's sentences (0: no intervals).
        by: ``reference`` or ``source`` (sources read through the runs' data config).

    Returns:
        A :class:`LengthTable`; runs that cannot be read, or score another test set, are left out with
        a note.

    Raises:
        ValueError: a bad ``splits`` (see :func:`_resolve_splits`), or ``by`` neither ``reference`` nor ``source``.
    """
    if by not in ("reference", "source"):
        raise ValueError(f"length by={by!r}: reference or source")
    notes: list[str] = []
    names = _resolve_splits([r for c in configs for r in c.runs], baseline.runs[0], splits, notes)
    table = LengthTable(list(buckets), names, n_bootstrap=n_bootstrap, notes=notes, by=by)
    corpora = _corpora(configs, baseline, names, notes, by == "source")
    if not corpora:
        return table
    first = next(iter(corpora.values()))  # the baseline's first readable run when it has one
    refs = first[1]
    indices, table.n_outside = bucket_indices(first[3] if by == "source" else refs, buckets)
    table.n_sentences = [len(i) for i in indices]
    filled = [b for b, n in enumerate(table.n_sentences) if n]
    table.reference = filled[0] if len(filled) > 1 else None
    data = first[0].config["data"]
    metrics = scorers(str(data.get("bleu_tokenize", "13a")), bool(data.get("lowercase", False)))
    rng = np.random.default_rng(seed)
    counts = [_resample_counts(rng, len(i), n_bootstrap) if i and n_bootstrap > 0 else None for i in indices]
    used = {c.label: [r for r in c.runs if r.run_dir in corpora] for c in configs}
    scores = {
        c.label: _scores([corpora[r.run_dir][2] for r in used[c.label]], refs, indices, counts, metrics)
        for c in configs
    }
    table.rows = _rows(configs, baseline, table, used, scores)
    if any(table.n_sentences):  # sacreBLEU knows a signature once it has scored
        table.signatures = {m: str(metric.get_signature()) for m, metric in metrics.items()}
    return table


def _corpora(
    configs: list[Configuration], baseline: Configuration, splits: Sequence[str], notes: list[str], with_sources: bool
) -> dict:
    """``{run folder: (run, references, hypotheses, sources)}`` of the runs that can be scored, the
    baseline's first; runs that cannot, or whose references differ from the first's, get a note instead."""
    out: dict = {}
    for run in [*baseline.runs, *(r for c in configs if c is not baseline for r in c.runs)]:
        try:
            hyps, refs, srcs = _pooled(run, splits, with_sources)
        except (ValueError, OSError) as e:  # no hypotheses, references not on this machine (DataError)
            notes.append(f"{run.run_dir}: left out of the length table ({' '.join(str(e).split())})")
            continue
        first = next(iter(out.values()), None)
        if first is not None and refs != first[1]:
            notes.append(
                f"{run.run_dir}: references differ from those of {first[0].run_dir}; left out of the length table"
            )
            continue
        out[run.run_dir] = (run, refs, hyps, srcs)
    return out


def _scores(
    runs_hyps: list[list[str]],
    refs: list[str],
    indices: list[list[int]],
    counts: list[np.ndarray | None],
    metrics: dict,
) -> dict[str, list[tuple[list[float], np.ndarray | None]]]:
    """One configuration's scores: ``{metric: [(per-seed scores, bootstrap values of their mean) per bucket]}``
    (bootstrap values ``[n_bootstrap]``, None without resamples or sentences)."""
    out = {}
    for m, metric in metrics.items():
        point: list[list[float]] = [[] for _ in indices]
        boot: list[list[np.ndarray]] = [[] for _ in indices]
        for hyps in runs_hyps:
            segments = metric._extract_corpus_statistics(hyps, [refs])  # [n_sentences][n_stats] ints
            stats = np.asarray(segments, dtype=np.float64) if any(c is not None for c in counts) else None
            for b, idx in enumerate(indices):
                if not idx:
                    continue
                # corpus_score of the bucket's sentences: the same sums of the same sentence statistics
                point[b].append(float(metric._aggregate_and_compute([segments[i] for i in idx]).score))
                if counts[b] is not None:
                    sums = counts[b] @ stats[idx]  # [n_bootstrap, n_stats]: each resample's summed statistics
                    boot[b].append(np.array([metric._compute_score_from_stats(s).score for s in sums]))
        out[m] = [(p, np.mean(v, axis=0) if v else None) for p, v in zip(point, boot)]
    return out


def _rows(
    configs: list[Configuration], baseline: Configuration, table: LengthTable, used: dict[str, list[Run]], scores: dict
) -> list[dict]:
    """The :data:`LENGTH_COLUMNS` rows of :func:`length_table`, configuration by configuration."""
    rows = []
    for c in configs:
        runs = used[c.label]
        for b, bucket in enumerate(table.buckets):
            row = {
                "label": c.label,
                "is_baseline": c is baseline,
                "bucket": bucket.label,
                "min_words": bucket.low,
                "max_words": bucket.high,
                "n_sentences": table.n_sentences[b],
                "n_runs": len(runs),
                "seeds": " ".join(str(r.seed) for r in runs),
                "test_splits": " ".join(table.splits),
                "n_bootstrap": table.n_bootstrap,
            }
            for m in METRICS:
                (seeds, values), (base_seeds, base_values) = scores[c.label][m][b], scores[baseline.label][m][b]
                row[f"{m}_mean"] = mean(seeds)
                row[f"{m}_ci_low"], row[f"{m}_ci_high"] = (None, None) if values is None else _interval(values)
                both = c is not baseline and bool(seeds) and bool(base_seeds)
                row[f"delta_{m}"] = mean(seeds) - mean(base_seeds) if both else None
                paired = both and values is not None and base_values is not None
                row[f"delta_{m}_ci_low"], row[f"delta_{m}_ci_high"] = (
                    _interval(values - base_values) if paired else (None, None)
                )
            row["bleu_seeds"] = " ".join(f"{r.seed}:{s:.2f}" for r, s in zip(runs, scores[c.label]["bleu"][b][0]))
            row.update(
                _change(scores[c.label]["bleu"], scores[baseline.label]["bleu"], b, table.reference, c is baseline)
            )
            rows.append(row)
    return rows


def _change(own: list, base: list, b: int, ref: int | None, is_baseline: bool) -> dict:
    """``change_bleu`` (bucket ``b`` against the reference bucket ``ref``) and ``delta_change_bleu``
    (against the baseline's change), with their intervals (module docstring); None up to the reference
    bucket itself, without one, or where a bucket has no score."""
    out: dict = dict.fromkeys(CHANGE_COLUMNS)
    if ref is None or b <= ref:
        return out
    (seeds, values), (first, first_values) = own[b], own[ref]
    if not seeds or not first:
        return out
    out["change_bleu"] = mean(seeds) - mean(first)
    change = None if values is None or first_values is None else values - first_values
    if change is not None:
        out["change_bleu_ci_low"], out["change_bleu_ci_high"] = _interval(change)
    (base_seeds, base_values), (base_first, base_first_values) = base[b], base[ref]
    if is_baseline or not base_seeds or not base_first:
        return out
    out["delta_change_bleu"] = out["change_bleu"] - (mean(base_seeds) - mean(base_first))
    if change is not None and base_values is not None and base_first_values is not None:
        out["delta_change_bleu_ci_low"], out["delta_change_bleu_ci_high"] = _interval(
            change - (base_values - base_first_values)
        )
    return out
