"""Batched translation in input order (transformer.generation.translate)."""

from __future__ import annotations

import pytest
import torch

from tests.generation.helpers import EOS, make_model
from transformer.config import GenerationConfig
from transformer.generation import generate
from transformer.generation.translate import (
    batches_by_tokens,
    detokenize,
    make_src_tokens,
    translate_dataset,
    translate_sentences,
)

ARCHS = ["encoder_decoder", "decoder_only"]


def random_ids(n: int, vocab: int = 40, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (n,), generator=g).tolist()
    return [torch.randint(5, vocab, (k,), generator=g).tolist() for k in lengths]


def test_make_src_tokens_formats() -> None:
    ids = [[5, 6, 7], [8]]
    assert make_src_tokens(ids, "encoder_decoder").tolist() == [[5, 6, 7, EOS], [8, EOS, 0, 0]]
    assert make_src_tokens(ids, "decoder_only").tolist() == [[5, 6, 7], [8, 0, 0]]
    with pytest.raises(ValueError):
        make_src_tokens(ids, "rnn")


def test_batches_by_tokens_respects_budget_and_covers_everything() -> None:
    lengths = [3, 10, 1, 7, 7, 2, 30, 5]
    batches = list(batches_by_tokens(lengths, max_tokens=40, rows_per_sentence=2))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) * 2 <= 40
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
    assert batches[0] == [6]  # too long for the budget: alone


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["beam", "greedy"])
def test_translate_sentences_restores_input_order(arch: str, strategy: str) -> None:
    model = make_model(arch, 40, eos_bias=5.5 if arch == "encoder_decoder" else 2.5, scale=2.0)
    src_ids = random_ids(13)
    small = GenerationConfig(strategy=strategy, beam_size=3, max_len_b=4, max_tokens=60)
    big = GenerationConfig(strategy=strategy, beam_size=3, max_len_b=4, max_tokens=100_000)
    a = translate_sentences(model, src_ids, small, "cpu", arch)
    b = translate_sentences(model, src_ids, big, "cpu")
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
    for ids, hyps in zip(src_ids, a):
        one = generate(model, make_src_tokens([ids], arch), small)[0]
        assert hyps[0].tokens == one[0].tokens


class FakeTokenizer:
    def decode(self, ids):
        out = []
        for i in ids:
            if i == EOS:
                break
            out.append(f"w{i}")
        return " ".join(out)


class FakeDataset:
    def __init__(self, src):
        self.src = src


def test_translate_dataset_and_detokenize() -> None:
    model = make_model("encoder_decoder", 40, scale=2.0)
    src_ids = random_ids(5)
    cfg = GenerationConfig(strategy="beam", beam_size=2, nbest=2, max_len_b=3)
    text = translate_dataset(model, FakeDataset(src_ids), FakeTokenizer(), cfg, "cpu")
    hyps = translate_sentences(model, src_ids, cfg, "cpu")
    assert text == [" ".join(f"w{i}" for i in h[0].tokens[:-1]) for h in hyps]
    assert detokenize(hyps[0], FakeTokenizer()) == [FakeTokenizer().decode(h.tokens) for h in hyps[0]]
