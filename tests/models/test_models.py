"""Model behaviour beyond the kit: fully padded rows, beam reordering and shared cross-attention rows.

Causality, padding, incremental (KV-cache) decoding, batched search, gradients and bf16 for every
option of every group run through the module-check kit (``transformer/testing/``,
``tests/test_testing.py``), the same checks a plugin's options pass."""

import itertools

import pytest
import torch

from tests.conftest import tiny_model_config
from transformer.models import build_model

ARCHS = ["encoder_decoder", "decoder_only"]
V, PAD, BOS, EOS, SEP = 40, 0, 2, 3, 4


def _model(arch, position, norm_position="pre", attention="gqa", dtype=torch.float32):
    cfg = tiny_model_config(
        arch=arch,
        norm_position=norm_position,
        attention__name=attention,
        attention__n_kv_heads=2 if attention == "gqa" else None,
    )
    cfg.position.name = position
    return build_model(cfg, V).eval().to(dtype)


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
