"""A beam step's selection alone (transformer.generation.beam.select_candidates) against an
exhaustive search on tiny vocabularies, and the bookkeeping around it."""

from __future__ import annotations

import itertools

import pytest
import torch

from transformer.generation.beam import cannot_improve, finishing, running_beams, select_candidates

NINF = float("-inf")


def _lprobs(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(*shape, generator=g) * 2.0, dim=-1)


def _search(next_lprobs, n: int, K: int, V: int, steps: int):
    """``steps`` selections keeping the ``K`` best candidates: ``(n, K)`` scores and token lists."""
    scores = torch.full((n, K), NINF)
    scores[:, 0] = 0.0
    seqs = [[() for _ in range(K)] for _ in range(n)]
    for _ in range(steps):
        lprobs = torch.stack([torch.stack([next_lprobs(s, p) for p in seqs[s]]) for s in range(n)])  # (n, K, V)
        cand_scores, tokens, beams = select_candidates(lprobs, scores)
        assert cand_scores.shape == (n, min(2 * K, K * V))
        scores = cand_scores[:, :K]
        seqs = [[seqs[s][b] + (t,) for b, t in zip(beams[s, :K].tolist(), tokens[s, :K].tolist())] for s in range(n)]
    return scores, seqs


def _exhaustive(next_lprobs, s: int, V: int, steps: int, k: int):
    """The ``k`` best of all ``V ** steps`` sequences of sentence ``s``, summed in float32 as the search sums."""
    total = {}
    for seq in itertools.product(range(V), repeat=steps):
        score = torch.tensor(0.0)
        for t in range(steps):
            score = score + next_lprobs(s, seq[:t])[seq[t]]
        total[seq] = score
    best = sorted(total, key=lambda q: -float(total[q]))[:k]
    return torch.stack([total[q] for q in best]), best


@pytest.mark.parametrize("K", [2, 3])
def test_one_selection_is_the_best_2k_of_every_extension(K: int) -> None:
    n, V = 3, 5
    lprobs = _lprobs((n, K, V), seed=K)
    scores = -torch.rand(n, K, generator=torch.Generator().manual_seed(10 + K)) * 3
    scores[1, 1:] = NINF  # a sentence with dead beams
    cand_scores, tokens, beams = select_candidates(lprobs.clone(), scores)
    for s in range(n):
        every = sorted(
            ((float(scores[s, b] + lprobs[s, b, t]), b, t) for b in range(K) for t in range(V)), key=lambda x: -x[0]
        )[: 2 * K]
        assert cand_scores[s].tolist() == [x[0] for x in every]
        live = [x for x in every if x[0] > NINF]  # -inf ties come in any order
        assert list(zip(beams[s].tolist(), tokens[s].tolist()))[: len(live)] == [(b, t) for _, b, t in live]


@pytest.mark.parametrize("K", [2, 3])
def test_selections_find_the_exhaustive_top_k_when_tokens_do_not_depend_on_the_prefix(K: int) -> None:
    """Vocabulary 5, 3 steps: with log-probabilities that depend on the position only, keeping the
    ``K`` best candidates each step is exact (a top-``K`` sequence's prefix is a top-``K`` prefix)."""
    n, V, steps = 2, 5, 3
    table = _lprobs((n, steps, V), seed=7)
    next_lprobs = lambda s, prefix: table[s, len(prefix)]  # noqa: E731
    scores, seqs = _search(next_lprobs, n, K, V, steps)
    for s in range(n):
        best_scores, best = _exhaustive(next_lprobs, s, V, steps, K)
        assert torch.equal(scores[s], best_scores)
        assert seqs[s] == best


def test_selections_with_a_beam_as_wide_as_the_prefixes_are_exhaustive() -> None:
    """Vocabulary 3, 3 steps, ``K = 9``: log-probabilities that depend on the whole prefix; every
    prefix fits in the beam, so the final selection is the exhaustive top ``K``."""
    n, V, steps, K = 2, 3, 3, 9
    drawn: dict = {}

    def next_lprobs(s: int, prefix: tuple) -> torch.Tensor:
        if (s, prefix) not in drawn:
            drawn[s, prefix] = _lprobs((V,), seed=len(drawn))
        return drawn[s, prefix]

    scores, seqs = _search(next_lprobs, n, K, V, steps)
    for s in range(n):
        best_scores, best = _exhaustive(next_lprobs, s, V, steps, K)
        assert torch.equal(scores[s], best_scores)
        assert seqs[s] == best


def test_bookkeeping_finishes_eos_among_k_best_and_runs_the_first_k_others() -> None:
    eos, K = 3, 2
    cand_scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-1.0, -2.0, NINF, NINF]])
    cand_tok = torch.tensor([[3, 5, 3, 6], [7, 3, 3, 3]])
    cand_beam = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0]])
    is_eos = cand_tok.eq(eos)
    assert finishing(cand_scores, is_eos, K).tolist() == [[True, False], [False, True]]
    scores, tokens, beams = running_beams(cand_scores, cand_tok, cand_beam, is_eos, K, eos)
    assert scores.tolist() == [[-2.0, -4.0], [-1.0, NINF]]  # an EOS among the K picked: a dead beam
    assert tokens.tolist() == [[5, 6], [7, 3]] and beams.tolist() == [[1, 0], [1, 0]]
    # a vocabulary too small for K beams: dead beams fill the slots
    scores, tokens, beams = running_beams(cand_scores[:, :1], cand_tok[:, :1], cand_beam[:, :1], is_eos[:, :1], K, eos)
    assert scores.tolist() == [[NINF, NINF], [-1.0, NINF]] and tokens.tolist() == [[3, 3], [7, 3]]
    kth = torch.tensor([-1.5, NINF], dtype=torch.float64)
    one = torch.tensor(1.0, dtype=torch.float64)
    assert cannot_improve(torch.tensor([[-2.0], [-1.0]]), kth, None, one).tolist() == [True, False]
    # with a length penalty the bound divides by the larger of lp(max_len + 1) and lp(t + 1)
    bound = torch.tensor([2.0, 1.0], dtype=torch.float64)
    assert cannot_improve(torch.tensor([[-2.0], [-1.0]]), kth, bound, one).tolist() == [False, False]
