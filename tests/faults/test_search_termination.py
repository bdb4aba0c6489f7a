"""Search always stops at its length bound. Non-finite model output (a diverged
model) ends with a warning and empty hypotheses, never a loop; greedy search warns too."""

from __future__ import annotations

import math

import pytest
import torch

from tests.faults.conftest import deadline
from tests.generation.helpers import EOS, TableModel, make_model, make_src
from transformer.generation import beam_search, generate, greedy_search, sample

VOCAB = 12
STRATEGIES = [dict(strategy="beam", beam_size=3), dict(strategy="greedy"), dict(strategy="sample", nbest=2)]


def _nan_model(arch: str = "encoder_decoder"):
    model = make_model(arch, VOCAB)
    with torch.no_grad():
        model.output_proj.weight.fill_(float("nan"))
    return model


@pytest.mark.parametrize("gen", STRATEGIES, ids=lambda g: g["strategy"])
@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_nan_model_output_warns_and_gives_empty_hypotheses(arch, gen):
    src = make_src(arch, [3, 5], VOCAB)
    with deadline(60), pytest.warns(RuntimeWarning, match="non-finite"):
        hyps = generate(_nan_model(arch), src, dict(max_len_a=1.0, max_len_b=4, **gen))
    assert hyps == [[], []]


def test_beams_that_meet_nan_die_the_others_finish():
    """Token 7 leads to NaN output; beam search goes on with the other beams and stops."""

    def fn(prefix):
        if 7 in prefix:
            return [float("nan")] * VOCAB
        lp = [-3.0] * VOCAB
        lp[7], lp[EOS] = -0.1, (-0.5 if len(prefix) >= 2 else -9.0)
        return lp

    with deadline(60), pytest.warns(RuntimeWarning, match="non-finite"):
        hyps = beam_search(
            TableModel(fn),
            torch.ones(2, 3, dtype=torch.long),
            beam_size=2,
            max_len_a=0.0,
            max_len_b=6,
            length_penalty_alpha=0.0,
        )
    for hs in hyps:
        assert hs and all(7 not in h.tokens and h.tokens[-1] == EOS and math.isfinite(h.score) for h in hs)


@pytest.mark.parametrize("search", [greedy_search, beam_search, sample])
def test_eos_never_possible_still_stops_at_the_length_bound(search):
    """A model that gives EOS -inf: the forced EOS at the maximum length ends every hypothesis."""

    def fn(prefix):
        lp = [math.log(1 / (VOCAB - 1))] * VOCAB
        lp[EOS] = float("-inf")
        return lp

    with deadline(60):
        hyps = search(TableModel(fn), torch.ones(2, 3, dtype=torch.long), max_len_a=0.0, max_len_b=5)
    assert all(hs and h.tokens[-1] == EOS and len(h.tokens) <= 6 for hs in hyps for h in hs)
    if search is not beam_search:  # beam search drops -inf candidates; greedy and sampling end at the bound
        assert all(len(h.tokens) == 6 for hs in hyps for h in hs)


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("gen", STRATEGIES, ids=lambda g: g["strategy"])
def test_learned_positions_bound_the_output_length(arch, gen):
    """``max_len_b`` beyond the learned positions: outputs stop at the last position, no error."""
    model = make_model(arch, VOCAB, position__name="learned", max_positions=16)
    src = make_src(arch, [5, 3], VOCAB)
    with deadline(60):
        hyps = generate(model, src, dict(max_len_a=0.0, max_len_b=50, min_len=50, **gen))
    n_src = src.ne(0).sum(1).tolist()
    for hs, n in zip(hyps, n_src):
        start = 0 if arch == "encoder_decoder" else n  # position of the first decoder input
        assert hs and all(len(h.tokens) == 16 - start for h in hs)
