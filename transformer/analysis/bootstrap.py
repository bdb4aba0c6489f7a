"""The paired bootstrap over test sentences and seeds (Clark et al. 2011; Davison & Hinkley 1997
§3.8): is a configuration's mean score over its seeds different from the baseline's, counting both
the sampling of test sentences and the seed-to-seed variation? The p-value is sacreBLEU's paired
bootstrap statistic on the resampled differences, 1 for an observed difference of 0
(docs/design.md#the-paired-bootstrap-over-sentences-and-seeds)."""

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
    """``[n_samples]`` float64 scores (0-100) of one run in each resample: sacreBLEU sentence statistics
    ``[n_sentences, n_stats]`` of ``metric``, summed over ``[n_samples, n_sentences]`` resample indices."""
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
    """The p-value in ``(0, 1]`` of the difference of two configurations' mean scores (1 when ``observed`` is 0).

    Args:
        baseline, system: ``[n_runs, n_samples]`` each run's score per sentence resample.
        observed: the observed difference of the means (system minus baseline).
        baseline_seeds, system_seeds: ``[n_samples, n_runs]`` the runs drawn in each resample.
    """
    if observed == 0:  # tied scores: no difference to attribute to chance or not
        return 1.0
    rows = np.arange(baseline.shape[1])[:, None]
    base = baseline.T[rows, baseline_seeds].mean(axis=1)  # [n_samples]: the drawn seeds' mean score
    sys = system.T[rows, system_seeds].mean(axis=1)
    diffs = np.abs(sys - base)
    centred = diffs - diffs.mean()  # the resampled differences shifted to no difference on average
    return (int(np.sum(centred > abs(observed))) + 1) / (len(diffs) + 1)
