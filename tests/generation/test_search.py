"""Greedy, beam and sampling search on tiny models of both families (transformer.generation.search)."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from tests.generation.helpers import (
    EOS,
    PAD,
    RecomputeModel,
    Recorder,
    TableModel,
    enumerate_outputs,
    make_model,
    make_src,
    sequence_logprob,
)
from transformer.config import GenerationConfig
from transformer.generation import (
    Hypothesis,
    beam_search,
    generate,
    greedy_search,
    length_penalty,
    sample,
    top_k_top_p_filter,
)
from transformer.generation.common import nonfinite_rows

ARCHS = ["encoder_decoder", "decoder_only"]
# EOS biases that give a mix of immediately finished and long hypotheses (see helpers.make_model)
MIXED = {"encoder_decoder": dict(eos_bias=5.5, scale=2.0), "decoder_only": dict(eos_bias=2.5, scale=2.0)}
LENGTHS = [3, 5, 7, 9, 4, 6, 2, 8]


def mixed_model(arch: str, vocab: int = 40, seed: int = 0):
    return make_model(arch, vocab, seed=seed, **MIXED[arch])


def tokens(hyps: list[list[Hypothesis]]) -> list[list[list[int]]]:
    return [[h.tokens for h in hs] for hs in hyps]


# ----------------------------------------------------------------------------- beam vs greedy


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("form", ["gnmt", "fairseq"])
def test_beam_size_one_equals_greedy(arch: str, form: str) -> None:
    model = mixed_model(arch)
    src = make_src(arch, LENGTHS, 40)
    kw = dict(max_len_a=1.0, max_len_b=4, min_len=1, length_penalty_alpha=0.0, length_penalty_form=form)
    greedy = greedy_search(model, src, **kw)
    beam = beam_search(model, src, beam_size=1, **kw)
    assert tokens(beam) == tokens(greedy)
    lengths = {len(h[0].tokens) for h in greedy}
    assert min(lengths) <= 3 and max(lengths) >= 6  # the model finishes at varied lengths
    for b, g in zip(beam, greedy):
        assert b[0].logprob == pytest.approx(g[0].logprob, abs=1e-5)


# ----------------------------------------------------------------------------- exhaustive search


@pytest.mark.parametrize(
    "arch,vocab,beam",
    [("encoder_decoder", 4, 16), ("decoder_only", 5, 48)],
)
@pytest.mark.parametrize(
    "alpha,form", [(0.0, "gnmt"), (1.0, "gnmt"), (2.0, "fairseq"), (-1.0, "fairseq"), (-0.5, "gnmt")]
)
def test_wide_beam_equals_exhaustive_enumeration(arch: str, vocab: int, beam: int, alpha: float, form: str) -> None:
    """With a beam holding every sequence, beam search returns the enumeration's ranking.

    Maximum length 3 (tokens before EOS), min_len 0, PAD banned. Non-zero penalties of both signs
    check that early termination never stops while a running beam could still win.
    """
    model = make_model(arch, vocab, scale=3.0, seed=1)
    src = make_src(arch, [3], vocab, seed=1)
    outs = enumerate_outputs(vocab, max_len=3, min_len=0)
    scored = sorted(
        ((sequence_logprob(model, src, w) / length_penalty(len(w), alpha, form), w) for w in outs),
        key=lambda x: -x[0],
    )
    nbest = 5
    got = beam_search(
        model,
        src,
        beam_size=beam,
        nbest=nbest,
        length_penalty_alpha=alpha,
        length_penalty_form=form,
        max_len_a=0.0,
        max_len_b=3,
        min_len=0,
    )[0]
    assert [h.tokens for h in got] == [w for _, w in scored[:nbest]]
    for h, (score, w) in zip(got, scored):
        assert h.score == pytest.approx(score, abs=1e-4)
        assert h.logprob == pytest.approx(sequence_logprob(model, src, w), abs=1e-4)


# ----------------------------------------------------------------------------- batching


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_beam_search_equals_one_sentence_at_a_time(arch: str) -> None:
    model = mixed_model(arch)
    src = make_src(arch, LENGTHS, 40)
    kw = dict(beam_size=4, nbest=3, length_penalty_alpha=0.6, max_len_a=1.0, max_len_b=3, no_repeat_ngram_size=3)
    batched = beam_search(model, src, **kw)
    for i, hyps in enumerate(batched):
        n = int(src[i].ne(PAD).sum())
        single = beam_search(model, src[i : i + 1, :n], **kw)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in single]
        torch.testing.assert_close(
            torch.tensor([h.score for h in hyps]), torch.tensor([h.score for h in single]), atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_greedy_and_sampling_equal_one_sentence_at_a_time(arch: str) -> None:
    model = mixed_model(arch)
    src = make_src(arch, LENGTHS, 40)
    batched = greedy_search(model, src, max_len_b=4)
    for i, hyps in enumerate(batched):
        n = int(src[i].ne(PAD).sum())
        assert hyps[0].tokens == greedy_search(model, src[i : i + 1, :n], max_len_b=4)[0][0].tokens
    # sampling with top_k=1 is greedy whatever the batch
    assert tokens(sample(model, src, top_k=1, max_len_b=4, seed=3)) == tokens(batched)


# ----------------------------------------------------------------------------- KV cache vs recomputation


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("position", ["sinusoidal", "rope", "alibi"])
def test_beam_search_with_cache_equals_recomputation(arch: str, position: str) -> None:
    """Every step's logits (all beams, all sentences) agree elementwise with a cache-free decoder."""
    model = make_model(arch, 40, seed=2, **MIXED[arch], position__name=position)
    src = make_src(arch, [3, 6, 4, 2], 40, seed=2)
    kw = dict(beam_size=3, nbest=3, length_penalty_alpha=0.6, max_len_a=1.0, max_len_b=3)
    cached, reference = Recorder(model), Recorder(RecomputeModel(model))
    a = beam_search(cached, src, **kw)
    b = beam_search(reference, src, **kw)
    assert tokens(a) == tokens(b)
    assert len(cached.logits) == len(reference.logits) > 3
    for x, y in zip(cached.logits, reference.logits):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    for ha, hb in zip(a, b):
        torch.testing.assert_close(torch.tensor([h.score for h in ha]), torch.tensor([h.score for h in hb]))


# ----------------------------------------------------------------------------- constraints


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_every_hypothesis_ends_with_exactly_one_eos_within_limits(arch: str, strategy: str) -> None:
    model = mixed_model(arch)
    src = make_src(arch, LENGTHS, 40)
    cfg = GenerationConfig(
        strategy=strategy, beam_size=4, nbest=2 if strategy != "greedy" else 1, max_len_a=0.5, max_len_b=2, min_len=2
    )
    n_src = src.ne(PAD).sum(1).tolist()
    for hyps, n in zip(generate(model, src, cfg), n_src):
        assert len(hyps) == cfg.nbest
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.tokens[-1] == EOS and h.tokens.count(EOS) == 1 and PAD not in h.tokens
            assert cfg.min_len + 1 <= len(h.tokens) <= int(0.5 * n + 2) + 1
            assert math.isfinite(h.score) and h.logprob <= 0


@pytest.mark.parametrize("arch", ARCHS)
def test_max_length_is_per_sentence_and_forces_eos(arch: str) -> None:
    model = make_model(arch, 40, eos_bias=-50.0)  # EOS only when forced
    src = make_src(arch, LENGTHS, 40)
    for strategy in ("greedy", "beam"):
        hyps = generate(model, src, GenerationConfig(strategy=strategy, beam_size=3, max_len_a=1.0, max_len_b=1))
        for h, n in zip(hyps, src.ne(PAD).sum(1).tolist()):
            assert len(h[0].tokens) == n + 1 + 1  # a * n + b tokens, then the forced EOS


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_min_len_delays_eos(strategy: str) -> None:
    model = make_model("encoder_decoder", 40, eos_bias=50.0)  # EOS first whenever allowed
    src = make_src("encoder_decoder", [4, 6], 40)
    for min_len in (0, 1, 3):
        cfg = GenerationConfig(strategy=strategy, beam_size=3, min_len=min_len)
        for hyps in generate(model, src, cfg):
            assert len(hyps[0].tokens) == min_len + 1


def test_no_repeat_ngram() -> None:
    model = make_model("encoder_decoder", 40, scale=4.0)  # repeats one token when unconstrained
    src = make_src("encoder_decoder", [5, 7], 40)
    free = greedy_search(model, src, max_len_b=12)
    assert any(len(set(h[0].tokens)) < len(h[0].tokens) - 2 for h in free)
    for n in (1, 2, 3):
        for strategy in ("greedy", "beam", "sample"):
            cfg = GenerationConfig(strategy=strategy, beam_size=3, no_repeat_ngram_size=n, max_len_b=12)
            for hyps in generate(model, src, cfg):
                body = hyps[0].tokens[:-1]
                grams = [tuple(body[i : i + n]) for i in range(len(body) - n + 1)]
                assert len(grams) == len(set(grams)), (n, strategy, body)


def test_beam_search_keeps_searching_while_length_penalty_can_still_win() -> None:
    """alpha > 0: a longer hypothesis found after the first finished one wins; alpha < 0 and 0
    stop early and keep the short one. Stopping at the first beam_size finished (a common
    shortcut) would return the short one for alpha > 0 too."""
    lp = math.log

    def fn(prefix: tuple[int, ...]) -> list[float]:
        # vocab: 0 pad, 1 unk, 2 bos, 3 eos, 4, 5
        if len(prefix) == 0:
            return [-1e9, -1e9, -1e9, lp(0.5), lp(0.3), lp(0.2)]
        if len(prefix) < 6:
            return [-1e9, -1e9, -1e9, lp(0.01), lp(0.98), lp(0.01)]
        return [-1e9, -1e9, -1e9, lp(0.98), lp(0.01), lp(0.01)]

    model = TableModel(fn)
    src = torch.ones(1, 3, dtype=torch.long)
    kw = dict(beam_size=1, max_len_a=0.0, max_len_b=10, min_len=0)
    short = [EOS]
    long_ = [4] * 6 + [EOS]
    assert beam_search(model, src, length_penalty_alpha=0.0, **kw)[0][0].tokens == short
    assert beam_search(model, src, length_penalty_alpha=-1.0, **kw)[0][0].tokens == short
    best = beam_search(model, src, length_penalty_alpha=2.0, length_penalty_form="fairseq", **kw)[0][0]
    assert best.tokens == long_
    expected_lp = lp(0.3) + 5 * lp(0.98) + lp(0.98)
    assert best.logprob == pytest.approx(expected_lp, abs=1e-5)
    assert best.score == pytest.approx(expected_lp / 7**2.0, abs=1e-6)


def test_negative_length_penalty_bound_uses_the_shortest_continuation() -> None:
    """alpha < 0 favours short outputs: a running beam's best case is to end at the next step, so
    dividing by the penalty at the maximum length (right for alpha > 0) would stop too early."""
    lp = math.log

    def fn(prefix: tuple[int, ...]) -> list[float]:
        if len(prefix) == 0:
            return [-1e9, -1e9, -1e9, lp(0.3), lp(0.6), lp(0.1)]
        return [-1e9, -1e9, -1e9, lp(0.95), lp(0.025), lp(0.025)]

    model = TableModel(fn)
    src = torch.ones(1, 3, dtype=torch.long)
    # fairseq form, alpha = -1: score = logprob * len; [EOS]: -1.20 * 1; [4, EOS]: -0.56 * 2 = -1.12
    best = beam_search(
        model,
        src,
        beam_size=2,
        length_penalty_alpha=-1.0,
        length_penalty_form="fairseq",
        max_len_a=0.0,
        max_len_b=10,
        min_len=0,
    )[0][0]
    assert best.tokens == [4, EOS]
    assert best.score == pytest.approx((lp(0.6) + lp(0.95)) * 2, abs=1e-5)


def test_first_step_has_no_duplicate_beams() -> None:
    model = mixed_model("encoder_decoder")
    src = make_src("encoder_decoder", [4, 6], 40)
    for hyps in beam_search(model, src, beam_size=5, nbest=5, length_penalty_alpha=0.0, max_len_b=3):
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps) == 5


# ----------------------------------------------------------------------------- sampling


def test_top_p_keeps_the_token_that_crosses_p() -> None:
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])  # sorted: 0.5 (1), 0.3 (3), 0.15 (0), 0.05 (2)
    for p, kept in [(0.3, {1}), (0.5, {1}), (0.51, {1, 3}), (0.8, {1, 3}), (0.81, {0, 1, 3}), (1.0, {0, 1, 2, 3})]:
        out = top_k_top_p_filter(probs.log().clone(), top_p=p)
        assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == kept, p
    out = top_k_top_p_filter(probs.log().clone(), top_p=1e-6)  # always at least one token
    assert torch.isfinite(out).sum() == 1
    out = top_k_top_p_filter(probs.log().clone(), top_k=2)
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == {1, 3}
    out = top_k_top_p_filter(probs.log().clone(), top_k=3, top_p=0.6)
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == {1, 3}
    with pytest.raises(ValueError):
        top_k_top_p_filter(probs.log(), top_p=0.0)


def test_sampling_stays_in_the_nucleus_and_follows_the_distribution() -> None:
    dist = [0.05, 0.5, 0.3, 0.15]  # EOS 0.05, tokens 4, 5, 6; pad/unk/bos impossible
    logits = [-1e9] * 3 + [math.log(p) for p in dist]
    model = TableModel(lambda prefix: logits)
    src = torch.ones(400, 2, dtype=torch.long)
    hyps = sample(model, src, top_p=0.75, seed=0, max_len_a=0.0, max_len_b=1, min_len=1)
    first = [h[0].tokens[0] for h in hyps]
    assert set(first) == {4, 5}  # 0.5 + 0.3 crosses 0.75; EOS (min_len) and 6 are outside
    assert 0.5 < first.count(4) / len(first) < 0.75  # renormalised: 0.5 / 0.8 = 0.625
    hot = sample(model, src, temperature=100.0, seed=0, max_len_a=0.0, max_len_b=1, min_len=1)
    assert {h[0].tokens[0] for h in hot} == {4, 5, 6}


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_is_seeded_and_temperature_zero_is_greedy(arch: str) -> None:
    model = mixed_model(arch)
    src = make_src(arch, LENGTHS, 40)
    a = sample(model, src, seed=7, temperature=1.5, n_samples=2, max_len_b=6)
    b = sample(model, src, seed=7, temperature=1.5, n_samples=2, max_len_b=6)
    c = sample(model, src, seed=8, temperature=1.5, n_samples=2, max_len_b=6)
    assert tokens(a) == tokens(b) and tokens(a) != tokens(c)
    assert all(len(h) == 2 for h in a)
    state = torch.get_rng_state()
    sample(model, src, seed=1, max_len_b=3)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is untouched
    assert tokens(sample(model, src, temperature=0.0, max_len_b=6)) == tokens(greedy_search(model, src, max_len_b=6))


def test_sample_logprob_is_the_model_logprob() -> None:
    model = mixed_model("encoder_decoder")
    src = make_src("encoder_decoder", [5], 40)
    for h in sample(model, src, seed=0, temperature=2.0, top_k=5, n_samples=3, max_len_b=20, min_len=0)[0]:
        assert h.logprob == pytest.approx(sequence_logprob(model, src, h.tokens), abs=1e-4)


# ----------------------------------------------------------------------------- dispatch and modes


def test_generate_accepts_dataclass_dictconfig_and_dict() -> None:
    model = mixed_model("encoder_decoder")
    src = make_src("encoder_decoder", [3, 5], 40)
    cfg = GenerationConfig(strategy="beam", beam_size=3, nbest=2)
    ref = tokens(generate(model, src, cfg))
    assert tokens(generate(model, src, OmegaConf.structured(cfg))) == ref
    assert tokens(generate(model, src, {"strategy": "beam", "beam_size": 3, "nbest": 2})) == ref
    with pytest.raises(ValueError, match="strategy"):
        generate(model, src, {"strategy": "viterbi"})
    with pytest.raises(ValueError, match="nbest"):
        generate(model, src, {"strategy": "beam", "beam_size": 2, "nbest": 3})


def test_generate_restores_training_mode_and_records_no_grad() -> None:
    model = make_model("encoder_decoder", 40)
    model.train()
    model.decoder.eval()  # a mixed state must come back exactly
    before = [m.training for m in model.modules()]
    src = make_src("encoder_decoder", [3, 5], 40)
    for strategy in ("greedy", "beam", "sample"):
        hyps = generate(model, src, {"strategy": strategy})
        assert [m.training for m in model.modules()] == before
        assert all(isinstance(h, Hypothesis) for hs in hyps for h in hs)


def test_dropout_is_off_during_generation() -> None:
    model = make_model("encoder_decoder", 40, dropout=0.5, **MIXED["encoder_decoder"])
    src = make_src("encoder_decoder", LENGTHS, 40)
    model.train()
    a, b = generate(model, src, {"strategy": "beam"}), generate(model, src, {"strategy": "beam"})
    assert tokens(a) == tokens(b)
    assert model.training


def test_nonfinite_rows_are_those_with_nan_or_plus_inf() -> None:
    """NaN or +inf anywhere in a row flags it; -inf (a banned token) and huge finite values do not."""
    inf, nan = float("inf"), float("nan")
    logits = torch.tensor(
        [[0.0, nan, 1.0], [-inf, inf, 0.0], [-inf, -inf, 2.0], [-inf, -inf, -inf], [3e38, -3e38, 1.0], [nan, inf, -inf]]
    )
    for dtype in (torch.float32, torch.bfloat16):
        assert nonfinite_rows(logits.to(dtype)).tolist() == [True, True, False, False, False, True]
