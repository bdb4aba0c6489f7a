"""The searches' hypotheses equal the ones recorded before they stopped reading the device every
step: every family and option combination of :mod:`tests.generation.search_cases`
(greedy, beam and sampling; both families; positions, windows, learned-position caps, forced and
banned EOS, n-gram blocking, length penalties of both forms and signs, a beam holding every
sequence, NaN output for some or all rows, an ensemble), by value: the same tokens and warnings,
and the same scores and log-probabilities up to the rounding of another CPU's kernels
(:data:`KERNEL_RTOL`)."""

from __future__ import annotations

import json

import pytest

from tests.generation.search_cases import OUTPUTS, cases, run_case

RECORDED = json.loads(OUTPUTS.read_text(encoding="utf-8"))
CASES = list(cases())
KERNEL_RTOL = 1e-5
"""Relative tolerance of a recorded score or log-probability: ATen's vectorised kernels differ by CPU
kind (``ATEN_CPU_CAPABILITY``: default, avx2, avx512), and a sum of tens of log-probabilities moves
by about 1.5e-6 relative between them; tokens, their order and the warnings stay exact."""


def test_every_case_was_recorded() -> None:
    assert sorted(name for name, *_ in CASES) == sorted(RECORDED)
    assert len(RECORDED) > 250


@pytest.mark.parametrize("name,model,src,gen", CASES, ids=[c[0] for c in CASES])
def test_hypotheses_equal_the_recorded_ones(name, model, src, gen) -> None:
    got, want = run_case(model, src, gen), RECORDED[name]
    assert got["warnings"] == want["warnings"]
    assert [[h[0] for h in hs] for hs in got["hyps"]] == [[h[0] for h in hs] for hs in want["hyps"]]
    for hs_got, hs_want in zip(got["hyps"], want["hyps"]):
        for (_, score, logprob), (_, score_want, logprob_want) in zip(hs_got, hs_want):
            assert score == pytest.approx(score_want, rel=KERNEL_RTOL, abs=1e-6)
            assert logprob == pytest.approx(logprob_want, rel=KERNEL_RTOL, abs=1e-6)
