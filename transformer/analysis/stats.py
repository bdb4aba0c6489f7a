"""Statistics of a comparison: means and sample standard deviations over seeds, and the paired
bootstrap of every configuration's test hypotheses against the baseline's, over sentences and seeds
(:mod:`.bootstrap`) and per seed pair."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from omegaconf import OmegaConf

from transformer.analysis.bootstrap import p_value, resampled_scores, seed_resamples, sentence_resamples
from transformer.analysis.collect import Run
from transformer.analysis.grouping import Configuration
from transformer.config import IGNORED_KEYS, is_ignored, with_defaults
from transformer.data.corpus import DataError, read_parallel, resolve_split_files
from transformer.evaluation.metrics import scorers
from transformer.models.flops import kv_cache_bytes_per_token

__all__ = [
    "first_result",
    "MissingReferences",
    "MissingSources",
    "Scores",
    "holm_bonferroni",
    "kv_cache_bytes",
    "mean",
    "pooled_std",
    "references",
    "seed_range",
    "significance",
    "sources",
    "std",
]


K = TypeVar("K")


def _numbers(values: Sequence[Any]) -> list[float]:
    """The numbers among ``values`` as floats (None, strings and booleans left out)."""
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def mean(values: Sequence[float]) -> float | None:
    """Mean of the numbers among ``values`` (None when there are none)."""
    values = _numbers(values)
    return statistics.fmean(values) if values else None


def std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (n - 1); None for fewer than two values."""
    values = _numbers(values)
    return statistics.stdev(values) if len(values) >= 2 else None


def seed_range(values: Sequence[float]) -> float | None:
    """``max - min`` of the numbers among ``values``; None for fewer than two (the seed-to-seed spread)."""
    values = _numbers(values)
    return max(values) - min(values) if len(values) >= 2 else None


def pooled_std(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """``(std, n_groups)``: the pooled within-group standard deviation
    ``sqrt(sum((n_i - 1) s_i^2) / sum(n_i - 1))`` (Montgomery, *Design and Analysis of Experiments*,
    §3.3), here the seed noise over every configuration. Groups under two numbers add nothing; ``std``
    is None when none has two."""
    squares, dof, used = 0.0, 0, 0
    for values in groups:
        values = _numbers(values)
        if len(values) < 2:
            continue
        squares += (len(values) - 1) * statistics.variance(values)
        dof += len(values) - 1
        used += 1
    return ((squares / dof) ** 0.5 if dof else None), used


def holm_bonferroni(p_values: Mapping[K, float | None]) -> dict[K, float | None]:
    """``{test: adjusted p}``: Holm-Bonferroni (Holm 1979), ``max_{j <= i} min(1, (m - j + 1) * p_(j))``
    over the ascending p-values; None (no test) stays None."""
    tests = sorted(((p, k) for k, p in p_values.items() if p is not None), key=lambda t: t[0])
    m = len(tests)
    adjusted: dict[K, float | None] = {k: None for k in p_values}
    running = 0.0
    for i, (p, key) in enumerate(tests):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[key] = running
    return adjusted


def first_result(runs: Sequence[Run], key: str) -> Any:
    """``results[key]`` of the first run that has it (None when none has)."""
    return next((r.results[key] for r in runs if r.results and r.results.get(key) is not None), None)


def kv_cache_bytes(config: dict | None) -> int | None:
    """KV-cache bytes per generated token of a run's model config (None when it cannot be computed)."""
    if not config or "model" not in config:
        return None
    try:
        return int(kv_cache_bytes_per_token(OmegaConf.create(config["model"])))
    except Exception:
        return None


_SPLIT_CACHE: dict[tuple[str, str], tuple[list[str], list[str]]] = {}


class MissingReferences(DataError):
    """A run's test references are neither stored in its folder nor on this machine."""


class MissingSources(DataError):
    """A run's test sources are not on this machine (a run folder stores none)."""


def _split_from_data(run: Run, split: str, what: str, stored: str) -> tuple[list[str], list[str]]:
    """Sources and references of ``run``'s test split, read through its data config, line-aligned as tested.

    Raises:
        DataError: the split's files are not on this machine (says where to point ``TRANSFORMER_DATA_DIR``).
    """
    data = run.config["data"]
    cache_key = (json.dumps(data, sort_keys=True, default=str), str(split))
    if cache_key not in _SPLIT_CACHE:
        try:
            src, tgt = resolve_split_files(OmegaConf.create(data), split, download=False)
        except DataError:  # a split the run tested: its data config knows it, its files are elsewhere
            kind = MissingReferences if what == "references" else MissingSources
            raise kind(
                f"the {what} of {split} are neither in {run.run_dir}{stored} nor on this "
                "machine; set TRANSFORMER_DATA_DIR (or data.root) to the folder that holds the data "
                "(e.g. TRANSFORMER_DATA_DIR=../shared/data)"
            ) from None
        _SPLIT_CACHE[cache_key] = read_parallel(src, tgt, keep_empty=True)  # line-aligned, as tested
    return _SPLIT_CACHE[cache_key]


def references(run: Run, split: str | None = None) -> list[str]:
    """The raw references of ``run``'s test split (default its own), one per hypothesis: those stored
    beside its hypotheses, else read through its data config.

    Raises:
        MissingReferences: none stored and the split's files are not on this machine.
    """
    split = split or run.test_split
    stored = run.refs_path(split)
    if stored is not None:
        lines = stored.read_text(encoding="utf-8").split("\n")  # exactly the lines written, one per hypothesis
        return lines[:-1] if lines[-1] == "" else lines
    return _split_from_data(run, split, "references", f" (hyps/{split}.ref)")[1]


def sources(run: Run, split: str | None = None) -> list[str]:
    """The raw sources of ``run``'s test split (default its own), line-aligned with its hypotheses, read
    through its data config.

    Raises:
        MissingSources: the split's files are not on this machine.
    """
    return _split_from_data(run, split or run.test_split, "sources", "")[0]


def _same_test_set(a: Run, b: Run) -> bool:
    """Same test split of the same data (fields a run recorded before they existed at their default;
    where the files are and how they were binarized do not count)."""

    def data(run: Run) -> dict:
        flat = with_defaults({"data": run.config.get("data", {})})
        return {k: v for k, v in flat.items() if k.startswith("data.") and not is_ignored(k, IGNORED_KEYS)}

    return a.test_split == b.test_split and data(a) == data(b)


def _seed_pairs(base: list[Run], other: list[Run]) -> list[tuple[Run, Run]]:
    """Seed-matched pairs; when no seed is shared, the i-th runs in seed order."""
    by_seed = {r.seed: r for r in other}
    pairs = [(b, by_seed[b.seed]) for b in base if b.seed in by_seed]
    return pairs or list(zip(base, other))


METRICS = ("bleu", "chrf")
"""The scores tested, as :func:`~transformer.evaluation.metrics.scorers` names them."""


class Scores:
    """Each run's corpus and resampled scores, computed once per run and shared by every comparison of a
    table over the same resamples (``seed`` seeds both the sentence and the seed resamples)."""

    def __init__(self, n_samples: int, seed: int) -> None:
        self.n_samples, self.seed = n_samples, seed
        self._runs: dict[Path, dict[str, tuple[float, np.ndarray]]] = {}
        self._resamples: dict[int, np.ndarray] = {}
        self.signature: str | None = None

    def of(self, run: Run, hyps: list[str], refs: list[str], data: dict) -> dict[str, tuple[float, np.ndarray]]:
        """``{metric: (corpus score, [n_samples] resampled scores)}`` of ``run`` whose hypotheses are
        ``hyps``, scored against ``refs`` with the tokenizer and case of the ``data`` config."""
        if run.run_dir not in self._runs:
            n = len(refs)
            if n not in self._resamples:
                self._resamples[n] = sentence_resamples(n, self.n_samples, self.seed)
            metrics = scorers(str(data.get("bleu_tokenize", "13a")), bool(data.get("lowercase", False)))
            out = {}
            for name in METRICS:
                metric = metrics[name]
                stats = metric._extract_corpus_statistics(hyps, [refs])
                score = float(metric._aggregate_and_compute(stats).score)
                out[name] = (score, resampled_scores(stats, metric, self._resamples[n]))
            if self.signature is None:  # as sacreBLEU's PairedTest signs its bootstrap
                signature = metrics["bleu"].get_signature()
                signature.update("seed", str(self.seed))
                signature.update("bs", self.n_samples)
                self.signature = str(signature)
            self._runs[run.run_dir] = out
        return self._runs[run.run_dir]

    def p_value(self, base: list[dict], system: list[dict], metric: str) -> float:
        """The p-value of ``system``'s mean ``metric`` against ``base``'s over their runs' scores
        (:meth:`of`), their seeds resampled too (:func:`~transformer.analysis.bootstrap.p_value`)."""
        rng = np.random.default_rng([self.seed, len(base), len(system)])
        observed = statistics.fmean(s[metric][0] for s in system) - statistics.fmean(b[metric][0] for b in base)
        return p_value(
            np.stack([b[metric][1] for b in base]),
            np.stack([s[metric][1] for s in system]),
            observed,
            seed_resamples(len(base), self.n_samples, rng),
            seed_resamples(len(system), self.n_samples, rng),
        )


def _paired_scores(
    baseline: Configuration, c: Configuration, scores: Scores, notes: list[str], unreferenced: list[Path] | None
) -> list[tuple[str, dict, dict]]:
    """``[(seed pair, baseline run's scores, c's run's scores)]`` of the seed pairs of ``c`` and the
    baseline that can be scored; each pair that cannot gets a note."""
    out = []
    for b, s in _seed_pairs(baseline.runs, c.runs):
        if not _same_test_set(b, s):
            notes.append(
                f"{c.label}: test set differs from the baseline's ({s.test_split} vs {b.test_split}); no p-value"
            )
            return []
        if s.hyps_path() is None or b.hyps_path() is None:
            missing = s if s.hyps_path() is None else b
            notes.append(f"{c.label}: no test hypotheses in {missing.run_dir}; seed pair skipped")
            continue
        try:
            refs = references(b)
        except MissingReferences as e:
            notes.append(f"{e}; no p-values for seed {b.seed}")
            if unreferenced is not None and b.run_dir not in unreferenced:
                unreferenced.append(b.run_dir)
            continue
        except Exception as e:  # an unknown split
            notes.append(f"references of {b.test_split} not found for {b.run_dir} ({e}); no p-values for seed {b.seed}")
            continue
        base_hyps = b.hyps_path().read_text(encoding="utf-8").splitlines()
        hyps = s.hyps_path().read_text(encoding="utf-8").splitlines()
        pair = str(b.seed) if b.seed == s.seed else f"{b.seed}/{s.seed}"
        if len(hyps) != len(refs) or len(base_hyps) != len(refs):
            notes.append(
                f"{c.label}: {len(hyps)} hypotheses / {len(base_hyps)} baseline hypotheses but {len(refs)} "
                f"references in {b.test_split}; seed pair skipped"
            )
            continue
        if hyps == base_hyps:
            notes.append(f"{c.label}: test hypotheses identical to the baseline's for seed {pair}; p = 1")
        data = b.config["data"]
        out.append((pair, scores.of(b, base_hyps, refs, data), scores.of(s, hyps, refs, data)))
    return out


def significance(
    configs: list[Configuration],
    baseline: Configuration,
    n_samples: int,
    seed: int,
    notes: list[str],
    unreferenced: list[Path] | None = None,
    scores: Scores | None = None,
) -> tuple[dict[str, dict], str | None]:
    """Every configuration against the baseline: the paired bootstrap over test sentences and seeds, and
    that of each seed-matched pair alone.

    Returns:
        ``({label: {"p_value", "chrf_p_value", "p_value_seeds"}}, bootstrap BLEU signature)``;
        ``p_value_seeds`` reads ``"1:0.1189 2:0.0050"`` (1 for tied scores). Baseline runs whose
        references could not be read are added to ``unreferenced``.
    """
    scores = Scores(n_samples, seed) if scores is None else scores
    out: dict[str, dict] = {}
    for c in configs:
        if c is baseline:
            continue
        pairs = _paired_scores(baseline, c, scores, notes, unreferenced)
        if not pairs:
            continue
        base = list({id(b): b for _, b, _ in pairs}.values())  # each run once, in seed order
        system = list({id(s): s for _, _, s in pairs}.values())
        out[c.label] = {
            "p_value": scores.p_value(base, system, "bleu"),
            "chrf_p_value": scores.p_value(base, system, "chrf"),
            "p_value_seeds": " ".join(f"{pair}:{scores.p_value([b], [s], 'bleu'):.4f}" for pair, b, s in pairs),
        }
    return out, scores.signature
