"""Ensembles of models at decoding time (transformer.generation.ensemble)."""

from __future__ import annotations

import pytest
import torch

from tests.generation.helpers import RecomputeModel, make_model, make_run_dir, make_src
from transformer.config import GenerationConfig
from transformer.generation import EnsembleModel, LoadError, beam_search, generate, greedy_search, load_models

ARCHS = ["encoder_decoder", "decoder_only"]
MIXED = {"encoder_decoder": dict(eos_bias=5.5, scale=2.0), "decoder_only": dict(eos_bias=2.5, scale=2.0)}
LENGTHS = [3, 5, 7, 9, 4, 6, 2, 8]


def _same(a, b) -> None:
    assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b]
    for hs_a, hs_b in zip(a, b):
        for x, y in zip(hs_a, hs_b):
            assert x.score == pytest.approx(y.score, abs=1e-4) and x.logprob == pytest.approx(y.logprob, abs=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_an_ensemble_of_a_model_with_itself_equals_the_model(arch: str, strategy: str) -> None:
    model = make_model(arch, **MIXED[arch])
    src = make_src(arch, LENGTHS, 40)
    gen = GenerationConfig(strategy=strategy, beam_size=4, nbest=2 if strategy == "beam" else 1, max_len_b=12)
    _same(generate(EnsembleModel([model, model, model]), src, gen), generate(model, src, gen))


@pytest.mark.parametrize("arch", ARCHS)
def test_step_scores_are_the_mean_of_the_members_log_probabilities(arch: str) -> None:
    a, b = make_model(arch, seed=1, **MIXED[arch]), make_model(arch, seed=2, **MIXED[arch])
    ens = EnsembleModel([a, b])
    src = make_src(arch, [4, 6], 40)
    with torch.no_grad():
        state, sa, sb = ens.start_decoding(src), a.start_decoding(src), b.start_decoding(src)
        tokens = torch.full((2, 1), a.decoder_start_token_id)
        got = ens.decode_step(tokens, state)
        want = (a.decode_step(tokens, sa).log_softmax(-1) + b.decode_step(tokens, sb).log_softmax(-1)) / 2
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_members_cache_follows_the_beams(arch: str) -> None:
    """Cached members give the same search as members that recompute everything without a cache."""
    a, b = make_model(arch, seed=1, **MIXED[arch]), make_model(arch, seed=2, **MIXED[arch])
    src = make_src(arch, LENGTHS, 40, seed=3)
    cached = beam_search(EnsembleModel([a, b]), src, beam_size=3, nbest=3, max_len_b=10)
    reference = beam_search(
        EnsembleModel([RecomputeModel(a), RecomputeModel(b)]), src, beam_size=3, nbest=3, max_len_b=10
    )
    _same(cached, reference)
    greedy = greedy_search(EnsembleModel([a, b]), src, max_len_b=10)
    _same(greedy, greedy_search(EnsembleModel([RecomputeModel(a), RecomputeModel(b)]), src, max_len_b=10))


def test_members_must_decode_alike() -> None:
    with pytest.raises(ValueError, match="member 1 has arch='decoder_only'"):
        EnsembleModel([make_model("encoder_decoder"), make_model("decoder_only")])
    with pytest.raises(ValueError, match="member 1 scores 30 tokens, member 0 40"):
        EnsembleModel([make_model("encoder_decoder", 40), make_model("encoder_decoder", 30)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ens")
    return make_run_dir(root / "a", seed=1), make_run_dir(root / "b", seed=2), make_run_dir(root / "c", vocab_size=200)


def test_load_models_builds_an_ensemble_and_refuses_another_vocabulary(runs) -> None:
    (a, model_a, tok, _), (b, model_b, _, _), (c, _, tok_c, _) = runs
    loaded = load_models([a, b / "checkpoint_best.safetensors"])
    assert isinstance(loaded.model, EnsembleModel) and len(loaded.model.models) == 2
    assert loaded.model.checkpoints == [a / "checkpoint_best.safetensors", b / "checkpoint_best.safetensors"]
    assert loaded.run_dir == a and loaded.cfg.generation.max_len_b == 5
    assert not isinstance(load_models([a]).model, EnsembleModel) and not isinstance(
        load_models(str(a)).model, EnsembleModel
    )
    with pytest.raises(
        LoadError,
        match=r"cannot join an ensemble with .*: its source vocabulary .*, \d+ pieces\) "
        r"differs from .*every model needs the same SentencePiece vocabulary",
    ):
        load_models([a, c])
    with pytest.raises(LoadError, match="names no checkpoint"):
        load_models([])


def test_learned_positions_of_a_member_cap_the_length() -> None:
    """A member with learned positions bounds the ensemble's output length, as it bounds its own."""
    short = make_model("encoder_decoder", seed=1, **{"position.name": "learned", "max_positions": 6})
    free = make_model("encoder_decoder", seed=2)
    src = make_src("encoder_decoder", [3, 4], 40)
    hyps = beam_search(EnsembleModel([free, short]), src, beam_size=2, max_len_b=20)
    assert all(len(h.tokens) <= 6 for hs in hyps for h in hs)  # at most 5 tokens + EOS
