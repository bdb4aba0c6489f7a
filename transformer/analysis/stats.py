"""Statistics of a comparison: means and sample standard deviations over seeds, and the paired
bootstrap of every configuration's test hypotheses against the baseline's, per seed pair."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf

from transformer.analysis.collect import Run
from transformer.analysis.grouping import IGNORED_KEYS, Configuration, is_ignored, with_defaults
from transformer.data.corpus import DataError, read_parallel, resolve_split_files
from transformer.evaluation.metrics import paired_bootstrap
from transformer.models.flops import kv_cache_bytes_per_token

__all__ = [
    "first_result",
    "MissingReferences",
    "holm_bonferroni",
    "kv_cache_bytes",
    "mean",
    "pooled_std",
    "references",
    "seed_range",
    "significance",
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
    """Pooled within-group standard deviation: ``sqrt(sum((n_i - 1) s_i^2) / sum(n_i - 1))``.

    Over the configurations of a ladder, each group being one configuration's test BLEU over its
    seeds, this is the seed-to-seed noise measured with every seed run, not only the baseline's
    (the textbook pooled variance of a one-way layout; e.g. Montgomery, *Design and Analysis of
    Experiments*, §3.3).

    Returns:
        ``(std, n_groups)``: groups with fewer than two numbers add nothing; ``std`` is None when
        no group has two.
    """
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
    """Holm-Bonferroni adjusted p-values of a family of tests (Holm 1979).

    With the m p-values sorted ascending, p_(1) <= ... <= p_(m), the adjusted value of the i-th is
    ``max_{j <= i} min(1, (m - j + 1) * p_(j))``; rejecting where the adjusted p < alpha controls the
    family-wise error rate at alpha. Missing p-values (None) are not tests and keep None.

    Args:
        p_values: ``{test: p}``.

    Returns:
        ``{test: adjusted p}`` for the same keys.
    """
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


_REF_CACHE: dict[tuple[str, str], list[str]] = {}


class MissingReferences(DataError):
    """A run's test references are neither stored in its folder nor on this machine."""


def references(run: Run, split: str | None = None) -> list[str]:
    """The raw references of ``run``'s test split ``split`` (default its own, :attr:`Run.test_split`),
    as the trainer scored them (every line, one per hypothesis, an empty source's included): those
    the run folder stores beside its hypotheses (:meth:`Run.refs_path`), else read through the
    run's data config.

    Raises:
        MissingReferences: the folder stores none and the split's files are not on this machine
            (never downloaded); the message says where to point ``TRANSFORMER_DATA_DIR``.
    """
    split = split or run.test_split
    stored = run.refs_path(split)
    if stored is not None:
        lines = stored.read_text(encoding="utf-8").split("\n")  # exactly the lines written, one per hypothesis
        return lines[:-1] if lines[-1] == "" else lines
    data = run.config["data"]
    cache_key = (json.dumps(data, sort_keys=True, default=str), str(split))
    if cache_key not in _REF_CACHE:
        try:
            src, tgt = resolve_split_files(OmegaConf.create(data), split, download=False)
        except DataError:  # a split the run tested: its data config knows it, its files are elsewhere
            raise MissingReferences(
                f"the references of {split} are neither in {run.run_dir} (hyps/{split}.ref) nor on this "
                "machine; set TRANSFORMER_DATA_DIR (or data.root) to the folder that holds the data "
                "(e.g. TRANSFORMER_DATA_DIR=../shared/data)"
            ) from None
        _REF_CACHE[cache_key] = read_parallel(src, tgt, keep_empty=True)[1]  # line-aligned, as tested
    return _REF_CACHE[cache_key]


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


def significance(
    configs: list[Configuration],
    baseline: Configuration,
    n_samples: int,
    seed: int,
    notes: list[str],
    unreferenced: list[Path] | None = None,
) -> tuple[dict[str, dict], str | None]:
    """Paired bootstrap of every configuration against the baseline, per seed pair.

    Args:
        unreferenced: receives each baseline run folder whose references could not be read
            (:class:`MissingReferences`), so that the comparison says so at its top.

    Returns:
        ``({label: {"p_value", "chrf_p_value", "p_value_seeds"}}, bootstrap BLEU signature)``.
    """
    out: dict[str, dict] = {}
    # baseline run -> {label: (hyps, system run)}
    systems: dict[Path, dict[str, list[str]]] = {}
    base_runs: dict[Path, Run] = {}
    seed_of_pair: dict[tuple[Path, str], str] = {}
    for c in configs:
        if c is baseline:
            continue
        pairs = _seed_pairs(baseline.runs, c.runs)
        for b, s in pairs:
            if not _same_test_set(b, s):
                notes.append(
                    f"{c.label}: test set differs from the baseline's ({s.test_split} vs {b.test_split}); no p-value"
                )
                break
            if s.hyps_path() is None or b.hyps_path() is None:
                missing = s if s.hyps_path() is None else b
                notes.append(f"{c.label}: no test hypotheses in {missing.run_dir}; seed pair skipped")
                continue
            systems.setdefault(b.run_dir, {})[c.label] = s.hyps_path().read_text(encoding="utf-8").splitlines()
            base_runs[b.run_dir] = b
            seed_of_pair[(b.run_dir, c.label)] = str(b.seed) if b.seed == s.seed else f"{b.seed}/{s.seed}"
    signature = None
    per_label: dict[str, list[tuple[str, float | None, float | None]]] = {}
    for b_dir, sys_hyps in systems.items():
        b = base_runs[b_dir]
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
        ok = {}
        for label, hyps in sys_hyps.items():
            if len(hyps) != len(refs) or len(base_hyps) != len(refs):
                notes.append(
                    f"{label}: {len(hyps)} hypotheses / {len(base_hyps)} baseline hypotheses but {len(refs)} "
                    f"references in {b.test_split}; seed pair skipped"
                )
            else:
                ok[label] = hyps
        for label in [k for k, v in ok.items() if v == base_hyps]:
            # sacreBLEU counts only strictly larger resampled differences, so identical outputs
            # would get p = 1/(n+1); no difference at all is p = 1.
            notes.append(
                f"{label}: test hypotheses identical to the baseline's for seed {seed_of_pair[(b_dir, label)]}; p = 1"
            )
            per_label.setdefault(label, []).append((seed_of_pair[(b_dir, label)], 1.0, 1.0))
            del ok[label]
        if not ok:
            continue
        tokenize = str(b.config["data"].get("bleu_tokenize", "13a"))
        lowercase = bool(b.config["data"].get("lowercase", False))
        res = paired_bootstrap(
            base_hyps, ok, refs, n_samples=n_samples, seed=seed, tokenize=tokenize, lowercase=lowercase
        )
        signature = signature or res["baseline"]["signatures"]["bleu"]
        for label in ok:
            per_label.setdefault(label, []).append(
                (seed_of_pair[(b_dir, label)], res[label]["bleu_p_value"], res[label]["chrf_p_value"])
            )
    for label, vals in per_label.items():
        bleu_p = [p for _, p, _ in vals if p is not None]
        chrf_p = [p for _, _, p in vals if p is not None]
        out[label] = {
            "p_value": max(bleu_p) if bleu_p else None,
            "chrf_p_value": max(chrf_p) if chrf_p else None,
            "p_value_seeds": " ".join(f"{s}:{p:.4f}" for s, p, _ in vals if p is not None),
        }
    return out, signature
