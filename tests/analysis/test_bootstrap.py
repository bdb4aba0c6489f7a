"""The paired bootstrap over test sentences and seeds (transformer.analysis.bootstrap), by value."""

from __future__ import annotations

import numpy as np
import pytest

from transformer.analysis.bootstrap import p_value, resampled_scores, sentence_resamples
from transformer.analysis.stats import Scores
from transformer.evaluation.metrics import paired_bootstrap, scorers

# Two seeds per configuration, four resamples of the sentences: row = seed, column = resample.
BASELINE = np.array([[10.0, 11.0, 9.0, 10.0], [12.0, 12.0, 13.0, 11.0]])
SYSTEM = np.array([[14.0, 15.0, 13.0, 14.0], [10.0, 11.0, 10.0, 12.0]])
BASELINE_SEEDS = np.array([[0, 0], [0, 1], [1, 1], [1, 0]])  # the seeds each resample draws
SYSTEM_SEEDS = np.array([[1, 1], [0, 1], [0, 0], [1, 0]])


@pytest.mark.parametrize(
    ("observed", "expected"),
    # resample means, baseline vs system: (10, 10), (11.5, 13), (13, 13), (10.5, 13); |differences|
    # 0, 1.5, 0, 2.5, mean 1, centred -1, 0.5, -1, 1.5; p = (1 + #{centred > |observed|}) / (4 + 1)
    [(0.4, 3 / 5), (-0.4, 3 / 5), (1.0, 2 / 5), (2.0, 1 / 5), (0.0, 1.0)],
)
def test_p_value_over_sentences_and_seeds_by_hand(observed, expected):
    assert p_value(BASELINE, SYSTEM, observed, BASELINE_SEEDS, SYSTEM_SEEDS) == pytest.approx(expected)


def test_tied_scores_in_every_resample_are_p_one():
    """sacreBLEU's strict ``>`` gives 1 / (R + 1), the smallest p, to two systems tied everywhere."""
    zeros = np.zeros((1, 1000))
    seeds = np.zeros((1000, 1), dtype=int)
    assert p_value(zeros, zeros, 0.0, seeds, seeds) == 1.0


def test_one_seed_each_is_sacrebleus_paired_bootstrap():
    """With one run per configuration the test is sacreBLEU's PairedTest, resamples and p-value alike."""
    rng = np.random.default_rng(0)
    words = "ein mann eine frau hund spielt im park auf der straße mit einem ball".split()
    refs = [" ".join(rng.choice(words, 8)) for _ in range(80)]
    base = [" ".join(r.split()[:-3]) if i % 3 else r for i, r in enumerate(refs)]
    system = [" ".join(r.split()[:-1]) if i % 4 else r for i, r in enumerate(refs)]
    expected = paired_bootstrap(base, {"system": system}, refs, n_samples=200, seed=7)["system"]
    resamples = sentence_resamples(len(refs), 200, 7)
    one = np.zeros((200, 1), dtype=int)
    for name, metric in scorers().items():
        stats = [metric._extract_corpus_statistics(h, [refs]) for h in (base, system)]
        observed = metric.corpus_score(system, [refs]).score - metric.corpus_score(base, [refs]).score
        scores = [resampled_scores(s, metric, resamples)[None] for s in stats]
        assert p_value(*scores, observed, one, one) == expected[f"{name}_p_value"]


def test_seeds_that_disagree_are_no_evidence_though_each_seed_pair_is():
    """Each seed pair alone is clear (every resample's difference is the same, 1/(R+1)), but the system's
    seeds disagree in sign against the baseline's (+2.0 and -0.2): over seeds, no significance."""
    scores = Scores(n_samples=200, seed=1)
    sentences = np.random.default_rng(1).normal(30.0, 1.0, 200)  # the resamples' shared ups and downs
    base = [{"bleu": (30.0, sentences)}, {"bleu": (30.1, sentences + 0.1)}]
    agree = [{"bleu": (32.0, sentences + 2.0)}, {"bleu": (32.1, sentences + 2.1)}]
    disagree = [{"bleu": (32.0, sentences + 2.0)}, {"bleu": (29.9, sentences - 0.1)}]
    for pair in range(2):
        assert scores.p_value([base[pair]], [disagree[pair]], "bleu") == 1 / 201
    assert scores.p_value(base, agree, "bleu") == 1 / 201
    # mean difference 0.9; a quarter of the resamples draw the high seed twice (|difference| about
    # 1.95), centred about 1.0 above the mean |difference|: p about 1/4
    assert 0.15 < scores.p_value(base, disagree, "bleu") < 0.35
