"""Collation for encoder-decoder and decoder-only (prefix LM)."""

from __future__ import annotations

import torch

from transformer.data.collate import collate, collate_decoder_only, collate_encoder_decoder
from transformer.data.dataset import ParallelDataset
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID

SRC = [[10, 11, 12], [20]]
TGT = [[30, 31], [40, 41, 42, 43]]


def test_encoder_decoder() -> None:
    b = collate_encoder_decoder(SRC, TGT, [7, 9])
    assert b.net_input["src_tokens"].tolist() == [[10, 11, 12, EOS_ID], [20, EOS_ID, PAD_ID, PAD_ID]]
    assert b.src_tokens is b.net_input["src_tokens"]
    assert b.net_input["prev_output_tokens"].tolist() == [[BOS_ID, 30, 31, PAD_ID, PAD_ID], [BOS_ID, 40, 41, 42, 43]]
    assert b.target.tolist() == [[30, 31, EOS_ID, PAD_ID, PAD_ID], [40, 41, 42, 43, EOS_ID]]
    assert b.ids.tolist() == [7, 9] and b.ntokens == 8 and b.nsentences == 2
    assert b.loss_mask.sum().item() == b.ntokens
    # teacher forcing: the target is the decoder input shifted left by one
    assert torch.equal(b.net_input["prev_output_tokens"][1, 1:], b.target[1, :-1])


def test_decoder_only_masks_source_and_separator() -> None:
    src, tgt = [[10, 11, 12], [20]], [[30, 31], [40, 41]]
    b = collate_decoder_only(src, tgt, [0, 1])
    assert b.net_input["tokens"].tolist() == [[10, 11, 12, SEP_ID, 30, 31], [20, SEP_ID, 40, 41, PAD_ID, PAD_ID]]
    assert b.target.tolist() == [[PAD_ID, PAD_ID, PAD_ID, 30, 31, EOS_ID], [PAD_ID, 40, 41, EOS_ID, PAD_ID, PAD_ID]]
    tokens, mask = b.net_input["tokens"], b.loss_mask
    for row, (s, t) in enumerate(zip(src, tgt)):
        # no loss at source positions (they would predict source tokens or SEP)
        assert not mask[row, : len(s)].any()
        # SEP's position predicts tgt[0]; the last target token predicts EOS
        assert tokens[row, len(s)] == SEP_ID and b.target[row, len(s)] == t[0]
        assert mask[row, len(s) : len(s) + len(t) + 1].all() and b.target[row, len(s) + len(t)] == EOS_ID
        # wherever a loss is taken (but the last), the target is the next input token
        idx = mask[row].nonzero().flatten()[:-1]
        assert torch.equal(b.target[row, idx], tokens[row, idx + 1])
    assert b.src_tokens.tolist() == [[10, 11, 12], [20, PAD_ID, PAD_ID]]
    assert b.ntokens == int(mask.sum()) == 6


def test_generation_only_batches() -> None:
    for fn in (collate_encoder_decoder, collate_decoder_only):
        b = fn(SRC, None, None)
        assert b.target.shape == (2, 0) and b.ntokens == 0 and b.ids.tolist() == [0, 1]
    b = collate_decoder_only(SRC, None, None)
    assert b.net_input["tokens"].tolist() == [[10, 11, 12, SEP_ID], [20, SEP_ID, PAD_ID, PAD_ID]]


def test_collate_dispatch_and_to() -> None:
    ds = ParallelDataset(src=SRC, tgt=TGT, src_text=["a", "b"], tgt_text=["c", "d"], name="toy")
    b = collate(ds, [1], "encoder_decoder").to("cpu")
    assert b.ids.tolist() == [1] and b.src_tokens.tolist() == [[20, EOS_ID]]
    assert "tokens" in collate(ds, [0, 1], "decoder_only").net_input
    assert collate(ds, [0], "decoder_only", with_target=False).ntokens == 0
