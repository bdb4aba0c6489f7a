"""Collation from the token arrays equals the list-based collation it replaced, tensor for tensor.

``_reference_*`` below is ``transformer/data/collate.py`` as it was before numpy read the rows: every
sentence a Python list, padded, one ``torch.tensor`` call per tensor. The batches of today's
:func:`~transformer.data.collate.collate` must equal its batches in every field, for both
architectures, with and without a target, padded to a multiple or not, from binarized splits
(:class:`~transformer.data.binarize.TokenSequences`) and from plain lists of id lists.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from transformer.data.batching import TokenBatchSampler
from transformer.data.binarize import TokenSequences
from transformer.data.collate import (
    Batch,
    collate,
    collate_decoder_only,
    collate_encoder_decoder,
    pad_sequences,
)
from transformer.data.dataset import ParallelDataset
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID

ARCHS = ("encoder_decoder", "decoder_only")

# ----------------------------------------------------------------------------- the reference


def _reference_pad(seqs: Sequence[Sequence[int]], pad: int = PAD_ID, multiple: int = 1) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0)
    width = -(-width // multiple) * multiple
    rows = [list(s) + [pad] * (width - len(s)) for s in seqs]
    return torch.tensor(rows, dtype=torch.long).reshape(len(seqs), width)


def _reference_ids(ids: Any, n: int) -> torch.Tensor:
    if ids is None:
        return torch.arange(n, dtype=torch.long)
    t = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if t.numel() != n:
        raise ValueError(f"{t.numel()} ids for {n} examples")
    return t


def _reference_encoder_decoder(src, tgt, ids=None, pad_to_multiple=1) -> Batch:
    n = len(src)
    m = pad_to_multiple
    src_tokens = _reference_pad([list(s) + [EOS_ID] for s in src], multiple=m)
    if tgt is None:
        prev = torch.empty((n, 0), dtype=torch.long)
        target = torch.empty((n, 0), dtype=torch.long)
        ntokens = 0
    else:
        if len(tgt) != n:
            raise ValueError(f"{n} sources but {len(tgt)} targets")
        prev = _reference_pad([[BOS_ID] + list(t) for t in tgt], multiple=m)
        target = _reference_pad([list(t) + [EOS_ID] for t in tgt], multiple=m)
        ntokens = sum(len(t) + 1 for t in tgt)
    return Batch(
        net_input={"src_tokens": src_tokens, "prev_output_tokens": prev},
        target=target,
        src_tokens=src_tokens,
        ids=_reference_ids(ids, n),
        ntokens=ntokens,
        nsentences=n,
    )


def _reference_decoder_only(src, tgt, ids=None, pad_to_multiple=1) -> Batch:
    n = len(src)
    m = pad_to_multiple
    src_tokens = _reference_pad([list(s) for s in src], multiple=m)
    if tgt is None:
        tokens = _reference_pad([list(s) + [SEP_ID] for s in src], multiple=m)
        target = torch.empty((n, 0), dtype=torch.long)
        ntokens = 0
    else:
        if len(tgt) != n:
            raise ValueError(f"{n} sources but {len(tgt)} targets")
        tokens = _reference_pad([list(s) + [SEP_ID] + list(t) for s, t in zip(src, tgt)], multiple=m)
        target = _reference_pad([[PAD_ID] * len(s) + list(t) + [EOS_ID] for s, t in zip(src, tgt)], multiple=m)
        ntokens = sum(len(t) + 1 for t in tgt)
    return Batch(
        net_input={"tokens": tokens},
        target=target,
        src_tokens=src_tokens,
        ids=_reference_ids(ids, n),
        ntokens=ntokens,
        nsentences=n,
    )


def _reference_collate(dataset, indices, arch, *, with_target=True, pad_to_multiple=1) -> Batch:
    src = [dataset.src[i] for i in indices]
    tgt = [dataset.tgt[i] for i in indices] if with_target else None
    if arch == "encoder_decoder":
        return _reference_encoder_decoder(src, tgt, list(indices), pad_to_multiple)
    if arch == "decoder_only":
        return _reference_decoder_only(src, tgt, list(indices), pad_to_multiple)
    raise ValueError(f"arch={arch!r} is not one of encoder_decoder, decoder_only")


# ----------------------------------------------------------------------------- helpers


def _assert_same(ours: Batch, ref: Batch, where: str = "") -> None:
    """Every field equal: tensors by dtype, shape and value, counts as Python ints."""
    assert ours.net_input.keys() == ref.net_input.keys(), where
    pairs = {f"net_input[{k}]": (ours.net_input[k], ref.net_input[k]) for k in ref.net_input}
    pairs.update(
        target=(ours.target, ref.target), src_tokens=(ours.src_tokens, ref.src_tokens), ids=(ours.ids, ref.ids)
    )
    for name, (a, b) in pairs.items():
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, f"{where} {name}"
        assert torch.equal(a, b), f"{where} {name}: {a.tolist()} != {b.tolist()}"
    assert type(ours.ntokens) is int and type(ours.nsentences) is int, where
    assert (ours.ntokens, ours.nsentences) == (ref.ntokens, ref.nsentences), where
    # one tensor where the list-based batch had one (the encoder's input is the source to generate from)
    assert (ours.src_tokens is ours.net_input.get("src_tokens")) == (ref.src_tokens is ref.net_input.get("src_tokens"))


def _random_lists(rng: random.Random, n: int, max_len: int, vocab: int) -> list[list[int]]:
    """``n`` id lists of 0 to ``max_len`` ids (a fifth of them empty), specials included."""
    return [
        [] if rng.random() < 0.2 else [rng.randrange(vocab) for _ in range(rng.randint(1, max_len))] for _ in range(n)
    ]


def _as_binarized(seqs: list[list[int]], dtype: type, rng: random.Random) -> TokenSequences:
    """``seqs`` as a binarized split would hold them: a flat array of ``dtype`` with unused rows
    around them, selected by ``rows`` (as a filtered training split is)."""
    order = list(range(len(seqs) * 2))
    rng.shuffle(order)
    mine = order[: len(seqs)]  # where each sequence sits in the flat array; the other rows are noise
    flat_rows: list[list[int]] = _random_lists(rng, len(order), 5, 60000 if dtype == np.uint16 else 1 << 20)
    for i, row in enumerate(mine):
        flat_rows[row] = seqs[i]
    lengths = np.array([len(s) for s in flat_rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.array([t for s in flat_rows for t in s], dtype=dtype)
    tokens.flags.writeable = False  # as the memory map is
    return TokenSequences(tokens, offsets, np.array(mine, dtype=np.int64))


# ----------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("seed", range(4))
def test_collate_equals_the_list_based_reference_on_random_datasets(seed: int) -> None:
    rng = random.Random(seed)
    n = 60
    vocab = 60000 if seed % 2 else 1 << 20  # ids of a uint16 split, and of an int32 one
    src, tgt = _random_lists(rng, n, 12, vocab), _random_lists(rng, n, 12, vocab)
    dtype = np.uint16 if vocab <= 1 << 16 else np.int32
    datasets = {
        "lists": ParallelDataset(src, tgt, None, None, "lists"),
        "tuples": ParallelDataset([tuple(s) for s in src], [tuple(t) for t in tgt], None, None, "tuples"),
        "binarized": ParallelDataset(_as_binarized(src, dtype, rng), _as_binarized(tgt, dtype, rng), None, None, "bin"),
    }
    batches = [[], [0], [rng.randrange(n)], list(range(n))]  # none, one, all in order
    batches += [rng.sample(range(n), rng.randint(2, n)) for _ in range(6)]  # any order
    batches += [[i for i in range(n) if not src[i]][:3]]  # empty sources only
    for name, ds in datasets.items():
        for arch in ARCHS:
            for multiple in (1, 8):
                for with_target in (True, False):
                    for indices in batches:
                        where = f"{name} {arch} pad_to_multiple={multiple} with_target={with_target} {indices}"
                        ref = _reference_collate(ds, indices, arch, with_target=with_target, pad_to_multiple=multiple)
                        ours = collate(ds, indices, arch, with_target=with_target, pad_to_multiple=multiple)
                        _assert_same(ours, ref, where)


def test_collate_functions_take_lists_as_before() -> None:
    """The list-taking functions: ids given or not, a target or not, and the same errors."""
    rng = random.Random(7)
    src, tgt = _random_lists(rng, 9, 6, 100), _random_lists(rng, 9, 6, 100)
    for ours, ref in (
        (collate_encoder_decoder, _reference_encoder_decoder),
        (collate_decoder_only, _reference_decoder_only),
    ):
        for ids in (None, list(range(10, 19)), torch.arange(9), np.arange(9)):
            for t in (tgt, None):
                for m in (1, 3, 8):
                    _assert_same(ours(src, t, ids, m), ref(src, t, ids, m), f"{ours.__name__} {ids} {m}")
        with pytest.raises(ValueError, match="9 sources but 8 targets"):
            ours(src, tgt[:8])
        with pytest.raises(ValueError, match="8 ids for 9 examples"):
            ours(src, tgt, list(range(8)))
    for m in (1, 8):
        assert torch.equal(pad_sequences(src, multiple=m), _reference_pad(src, multiple=m))
        assert torch.equal(pad_sequences(src, pad=-1, multiple=m), _reference_pad(src, pad=-1, multiple=m))
    assert pad_sequences([]).shape == _reference_pad([]).shape == (0, 0)
    with pytest.raises(ValueError, match="encoder_decoder, decoder_only"):
        collate(ParallelDataset(src, tgt, None, None, "toy"), [0], "encoder")


def test_collate_equals_the_reference_on_multi30k(en_de_data) -> None:
    """Every batch of an epoch of the real training split (memory-mapped), both architectures, a
    multiple of 8 on every other batch; and the validation split without its target."""
    train = en_de_data.splits["train"]
    assert isinstance(train.src, TokenSequences) and train.src.tokens.dtype == np.uint16
    for arch in ARCHS:
        sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, 4096, arch=arch, seed=3)
        sampler.set_epoch(1)
        for k, indices in enumerate(sampler):
            m = 8 if k % 2 else 1
            ref = _reference_collate(train, indices, arch, pad_to_multiple=m)
            _assert_same(collate(train, indices, arch, pad_to_multiple=m), ref, f"{arch} batch {k}")
        valid = en_de_data.splits["valid"]
        for indices in (list(range(0, len(valid), 3)), list(range(len(valid)))[::-7]):
            ref = _reference_collate(valid, indices, arch, with_target=False)
            _assert_same(collate(valid, indices, arch, with_target=False), ref, f"{arch} valid")


@pytest.mark.parametrize("arch", ARCHS)
def test_a_batch_is_one_buffer_of_aligned_tensors(arch: str) -> None:
    """The token tensors share one host buffer (one allocation, one copy to pin), each starting
    on a 64-byte boundary."""
    ds = ParallelDataset([[5, 6, 7], [8]], [[9], [10, 11, 12, 13, 14]], None, None, "toy")
    b = collate(ds, [0, 1], arch, pad_to_multiple=1)
    tensors = [*b.net_input.values(), b.target, b.src_tokens]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert all(t.is_contiguous() and t.data_ptr() % 64 == 0 for t in tensors)
