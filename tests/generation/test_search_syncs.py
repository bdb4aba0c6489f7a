"""What lets the searches decode without reading the device every step: the cross-attention side
of a decoding state follows host-known indices (transformer.models.state), and a beam search's
finished hypotheses merge on the device (transformer.generation.finished)."""

from __future__ import annotations

import torch

from tests.generation.helpers import make_model, make_src
from transformer.generation.finished import Finished
from transformer.models.state import source_runs


def test_source_runs_finds_equal_runs_else_one_source_per_row() -> None:
    assert source_runs([4, 4, 0, 0]) == ([4, 0], 2)
    assert source_runs([0, 0, 0, 1, 1, 1]) == ([0, 1], 3)
    assert source_runs([0, 0, 1]) == ([0, 0, 1], 1)  # unequal runs
    assert source_runs([1, 0, 1]) == ([1, 0, 1], 1)
    assert source_runs([2, 5]) == ([2, 5], 1)


def test_reorder_with_host_indices_equals_reading_them() -> None:
    """The same reorders (expand to beams, swap within sentences, drop a sentence, rows leaving one
    by one) with and without ``host_index`` give the same cross side and the same logits."""
    model = make_model("encoder_decoder", 40, seed=3)
    src = make_src("encoder_decoder", [3, 6, 4], 40)
    with torch.no_grad():
        a, b = model.start_decoding(src), model.start_decoding(src)
        for index in ([0, 0, 1, 1, 2, 2], [1, 0, 3, 3, 4, 5], [4, 5, 0, 1], [0, 2, 3], [2]):
            ix = torch.tensor(index)
            a.reorder(ix)
            b.reorder(ix, index)
            assert a.group == b.group
            side_a = a.memory if a.memory is not None else a.cross_caches[0].k
            side_b = b.memory if b.memory is not None else b.cross_caches[0].k
            torch.testing.assert_close(side_b, side_a)  # the same rows, shared the same way
            tokens = torch.randint(5, 40, (len(index), 1))
            torch.testing.assert_close(model.decode_step(tokens, b), model.decode_step(tokens, a))


def test_finished_keeps_the_k_best_in_order_ties_first_come() -> None:
    fin = Finished(1, 2, 4, torch.device("cpu"))
    one = torch.tensor(1.0, dtype=torch.float64)
    hist = torch.tensor([[[7], [8]]])  # (n, K, step 1)
    fin.add(torch.tensor([[True, True]]), torch.tensor([[-2.0, -1.0]]), one, hist, torch.tensor([[0, 1]]), 1, 3)
    fin.add(
        torch.tensor([[True, False]]),
        torch.tensor([[-1.0, -0.5]]),
        one,
        torch.tensor([[[9, 9], [8, 8]]]),
        torch.tensor([[1, 0]]),
        2,
        3,
    )
    assert fin.kth(2).tolist() == [-1.0] and fin.kth(1).tolist() == [-1.0]
    fin.store([0], [0])
    got = fin.read(2)[0]
    # -1.0 twice: the one that finished first (shorter) first; -2.0 dropped (K = 2); the -0.5 did not finish
    assert [(h.tokens, h.score) for h in got] == [([8, 3], -1.0), ([8, 8, 3], -1.0)]
