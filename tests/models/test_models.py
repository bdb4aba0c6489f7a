"""Model behaviour for every position type and both families: causality, padding, KV cache."""

import itertools

import pytest
import torch

from tests.conftest import tiny_model_config
from transformer.models import build_model

POSITIONS = ["sinusoidal", "learned", "rope", "alibi", "none"]
ARCHS = ["encoder_decoder", "decoder_only"]
V, PAD, BOS, EOS, SEP = 40, 0, 2, 3, 4


def _model(arch, position, norm_position="pre", attention="gqa", dtype=torch.float32):
    cfg = tiny_model_config(arch=arch, norm_position=norm_position, attention__name=attention, attention__n_kv_heads=2 if attention == "gqa" else None)
    cfg.position.name = position
    return build_model(cfg, V).eval().to(dtype)


def _logits(model, src, tgt):
    """Teacher-forced logits over the target positions, ``(B, T, V)``; src/tgt without specials."""
    if model.arch == "encoder_decoder":
        return model(src, tgt)
    return model(torch.cat([src, tgt], dim=1))[:, src.shape[1] :]


@pytest.mark.parametrize("arch,position", itertools.product(ARCHS, POSITIONS))
def test_causality_future_tokens_never_change_earlier_outputs(arch, position):
    model = _model(arch, position)
    src = torch.randint(5, V, (2, 6))
    tgt = torch.randint(5, V, (2, 8))
    tgt2 = tgt.clone()
    tgt2[:, 5:] = torch.randint(5, V, (2, 3))
    with torch.no_grad():
        a, b = _logits(model, src, tgt), _logits(model, src, tgt2)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-5, rtol=1e-5)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-4


@pytest.mark.parametrize("arch,position", itertools.product(ARCHS, POSITIONS))
def test_padding_never_changes_real_positions(arch, position):
    model = _model(arch, position)
    src = torch.randint(5, V, (1, 5))
    tgt = torch.randint(5, V, (1, 4))
    with torch.no_grad():
        if arch == "encoder_decoder":
            ref = model(src, tgt)
            padded = model(torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1), torch.cat([tgt, torch.zeros(1, 2, dtype=torch.long)], 1))
            torch.testing.assert_close(padded[:, :4], ref, atol=1e-5, rtol=1e-5)
        else:
            seq = torch.cat([src, torch.tensor([[SEP]]), tgt], 1)
            ref = model(seq)
            padded = model(torch.cat([seq, torch.zeros(1, 3, dtype=torch.long)], 1))
            torch.testing.assert_close(padded[:, : seq.shape[1]], ref, atol=1e-5, rtol=1e-5)
        # batched with a longer neighbour: the same logits
        other = torch.randint(5, V, (1, 9))
        if arch == "encoder_decoder":
            batch_src = torch.cat([torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], 1), other], 0)
            batch_tgt = torch.cat([tgt, torch.randint(5, V, (1, 4))], 0)
            torch.testing.assert_close(model(batch_src, batch_tgt)[:1], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch,dtype", itertools.product(ARCHS, [torch.float32, torch.bfloat16]))
def test_fully_padded_rows_stay_finite(arch, dtype):
    model = _model(arch, "alibi", dtype=dtype)
    src = torch.randint(5, V, (2, 5))
    src[1] = PAD  # an all-padding source row
    with torch.no_grad():
        if arch == "encoder_decoder":
            out = model(src, torch.randint(5, V, (2, 3)))
        else:
            state = model.start_decoding(src)
            out = model.decode_step(torch.full((2, 1), SEP), state)
    assert torch.isfinite(out.float()).all()


def _teacher_forced_steps(model, src_rows, tgt):
    """Logits of the full forward at each target step, per row, ``(B, T, V)``."""
    rows = []
    for b, s in enumerate(src_rows):
        s = s[None]
        if model.arch == "encoder_decoder":
            s = torch.cat([s, torch.tensor([[EOS]])], 1)
            rows.append(model(s, torch.cat([torch.tensor([[BOS]]), tgt[b : b + 1, :-1]], 1))[0])
        else:
            seq = torch.cat([s, torch.tensor([[SEP]]), tgt[b : b + 1, :-1]], 1)
            rows.append(model(seq)[0, s.shape[1] :])
    return torch.stack(rows)


@pytest.mark.parametrize(
    "arch,position,norm_position,attention",
    [(a, p, n, at) for a in ARCHS for p in POSITIONS for n, at in [("pre", "gqa"), ("post", "mha")]],
)
def test_kv_cache_decoding_equals_full_forward_at_every_step(arch, position, norm_position, attention):
    model = _model(arch, position, norm_position, attention)
    lengths = [6, 3, 5]
    src_rows = [torch.randint(5, V, (n,)) for n in lengths]
    tgt = torch.randint(5, V, (3, 6))
    width = max(lengths) + (1 if arch == "encoder_decoder" else 0)
    src = torch.full((3, width), PAD)
    for b, s in enumerate(src_rows):
        src[b, : len(s)] = s
        if arch == "encoder_decoder":
            src[b, len(s)] = EOS
    with torch.no_grad():
        expected = _teacher_forced_steps(model, src_rows, tgt)
        state = model.start_decoding(src)
        prev = torch.full((3, 1), model.decoder_start_token_id)
        steps = []
        for t in range(tgt.shape[1]):
            steps.append(model.decode_step(prev, state))
            prev = tgt[:, t : t + 1]
    torch.testing.assert_close(torch.stack(steps, 1), expected, atol=1e-5, rtol=1e-4)


def test_state_reorder_follows_beams():
    model = _model("encoder_decoder", "rope")
    src = torch.randint(5, V, (2, 4))
    with torch.no_grad():
        state = model.start_decoding(src)
        state.reorder(torch.tensor([0, 0, 1, 1]))  # expand to 2 beams
        logits = model.decode_step(torch.full((4, 1), BOS), state)
    torch.testing.assert_close(logits[0], logits[1])
    torch.testing.assert_close(logits[2], logits[3])
    assert state.batch_size == 4 and state.memory is None


def test_beams_share_the_cross_attention_rows_of_their_sentence():
    """Expanding to beams and following them leaves one cross-attention row per source; logits are
    those of a state whose cross side was copied to every row."""
    model = _model("encoder_decoder", "sinusoidal")
    src = torch.randint(5, V, (3, 5))
    src[1, 3:] = 0  # padding: the memory mask follows the sources too
    with torch.no_grad():
        shared, copied = model.start_decoding(src), model.start_decoding(src)
        expand = torch.arange(3).repeat_interleave(2)  # 3 sentences x 2 beams
        shared.reorder(expand)
        copied.reorder(expand)
        # the reference: one cross-attention row per decoder row (group 1), as before sharing
        copied.memory, copied.memory_mask = copied.memory[expand], copied.memory_mask[expand]
        copied.group = 1
        assert shared.group == 2 and shared.memory.shape[0] == 3
        tokens = torch.full((6, 1), BOS)
        torch.testing.assert_close(model.decode_step(tokens, shared), model.decode_step(tokens, copied))
        assert shared.cross_caches[0].k.shape[0] == 3 and copied.cross_caches[0].k.shape[0] == 6
        k_before = shared.cross_caches[0].k
        for state in (shared, copied):
            state.reorder(torch.tensor([1, 0, 3, 3, 4, 5]))  # beams swap and duplicate within sentences
        assert shared.cross_caches[0].k is k_before  # nothing copied
        tokens = torch.randint(5, V, (6, 1))
        torch.testing.assert_close(model.decode_step(tokens, shared), model.decode_step(tokens, copied))
        for state in (shared, copied):
            state.reorder(torch.tensor([4, 5, 0, 1]))  # sentence 1 finished; the others swap places
        assert shared.group == 2 and shared.cross_caches[0].k.shape[0] == 2
        tokens = torch.randint(5, V, (4, 1))
        torch.testing.assert_close(model.decode_step(tokens, shared), model.decode_step(tokens, copied))
