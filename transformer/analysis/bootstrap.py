"""The paired bootstrap over test sentences and seeds: is a configuration's mean score over its
seeds different from the baseline's, counting both the sampling of test sentences and the
seed-to-seed variation of training?

Each resample draws the test sentences with replacement (the same sentences for every run, so the
comparison is paired over sentences) and, independently for each of the two configurations, its
seeds with replacement (the replicates of Clark et al. 2011, *Better Hypothesis Testing for
Statistical Machine Translation: Controlling for Optimizer Instability*; a two-level bootstrap,
Davison & Hinkley 1997, §3.8). A configuration's score in a resample is the mean, over its drawn
seeds, of each seed's corpus score on the drawn sentences; the resample's difference is the
system's minus the baseline's. The p-value is sacreBLEU's paired bootstrap statistic applied to these
differences (:mod:`sacrebleu.significance`, after Moses'
``bootstrap-hypothesis-difference-significance.pl``): with ``d_r`` the absolute difference of
resample ``r`` and ``d`` the observed one,

    p = (1 + #{r : d_r - mean(d_r) > d}) / (R + 1),

so with one seed per configuration it is sacreBLEU's ``PairedTest(test_type="bs")`` p-value, the same
resamples included (:func:`sentence_resamples` draws them as sacreBLEU does). An observed difference
of exactly 0 (the same score, e.g. BLEU 0.00 twice, or tied in every resample) is no evidence of a
difference: ``p = 1``, where sacreBLEU's strict ``>`` gives the smallest p, ``1 / (R + 1)``.

Scores of a resample come from sacreBLEU's own sentence statistics, summed as its paired bootstrap
sums them (float32, exact for counts below 2**24).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["p_value", "resampled_scores", "seed_resamples", "sentence_resamples"]

_CHUNK = 100
"""Resamples summed at once (``[chunk, n_sentences, n_stats]`` float32 in memory)."""


def sentence_resamples(n_sentences: int, n_samples: int, seed: int | None) -> np.ndarray:
    """``[n_samples, n_sentences]`` sentence indices drawn with replacement, sacreBLEU's draw
    (``np.random.default_rng(seed).choice``, as ``_paired_bs_test`` draws them)."""
    return np.random.default_rng(seed).choice(n_sentences, size=(n_samples, n_sentences), replace=True)


def seed_resamples(n_runs: int, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """``[n_samples, n_runs]`` indices of a configuration's runs (its seeds) drawn with replacement."""
    return rng.integers(0, n_runs, size=(n_samples, n_runs))


def resampled_scores(stats: Sequence, metric, resamples: np.ndarray) -> np.ndarray:
    """One run's corpus score in each resample of its test sentences.

    Args:
        stats: sacreBLEU's sentence statistics of the run (``metric._extract_corpus_statistics``),
            ``[n_sentences, n_stats]``.
        metric: the sacreBLEU metric (BLEU, chrF) that extracted them.
        resamples: ``[n_samples, n_sentences]`` sentence indices (:func:`sentence_resamples`).

    Returns:
        ``[n_samples]`` scores (0-100), float64.
    """
    stats = np.asarray(stats, dtype=np.float32)
    scores = []
    for start in range(0, len(resamples), _CHUNK):
        for sums in stats[resamples[start : start + _CHUNK]].sum(axis=1):  # [chunk, n_stats]
            scores.append(metric._compute_score_from_stats(sums).score)
    return np.array(scores, dtype=np.float64)


def p_value(
    baseline: np.ndarray,
    system: np.ndarray,
    observed: float,
    baseline_seeds: np.ndarray,
    system_seeds: np.ndarray,
) -> float:
    """The p-value of the difference between two configurations' mean scores (module docstring).

    Args:
        baseline: ``[n_baseline_runs, n_samples]``: each of the baseline's runs' scores in each
            resample of the sentences (:func:`resampled_scores`, the same resamples for every run).
        system: ``[n_system_runs, n_samples]``, the other configuration's.
        observed: the observed difference of the mean scores (system minus baseline).
        baseline_seeds: ``[n_samples, n_baseline_runs]`` the baseline's runs drawn in each resample
            (:func:`seed_resamples`).
        system_seeds: ``[n_samples, n_system_runs]``, the system's.

    Returns:
        ``p`` in ``(0, 1]``; 1 when ``observed`` is 0.
    """
    if observed == 0:  # tied scores: no difference to attribute to chance or not
        return 1.0
    rows = np.arange(baseline.shape[1])[:, None]
    base = baseline.T[rows, baseline_seeds].mean(axis=1)  # [n_samples]: the drawn seeds' mean score
    sys = system.T[rows, system_seeds].mean(axis=1)
    diffs = np.abs(sys - base)
    centred = diffs - diffs.mean()  # the resampled differences shifted to no difference on average
    return (int(np.sum(centred > abs(observed))) + 1) / (len(diffs) + 1)
