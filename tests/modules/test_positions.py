"""Position encodings checked by value against the papers' formulas."""

import math

import pytest
import torch

from transformer.modules.positions import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_slopes,
    apply_rotary,
    sinusoidal_table,
)


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (50, 10), (99, 31)])
def test_sinusoidal_table_equals_paper_formula(pos, i):
    d_model = 64
    table = sinusoidal_table(100, d_model)
    angle = pos / 10000 ** (2 * i / d_model)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_embedding_extends_beyond_table():
    emb = SinusoidalPositionalEmbedding(16, max_positions=4)
    out = emb.embed(torch.tensor([[0, 9]]))
    torch.testing.assert_close(out[0, 1], sinusoidal_table(10, 16)[9])


def test_alibi_slopes_for_8_heads():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))


def test_alibi_slopes_not_power_of_two_follow_reference_code():
    # Press et al. reference: the 4-head slopes, then every other slope of 8 heads.
    expected = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8] + [2.0**-1, 2.0**-3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected))
    assert alibi_slopes(12).shape == (12,)


def test_alibi_bias_values():
    alibi = ALiBi(2)
    pos = torch.arange(4)[None]
    causal = alibi.score_bias(pos, pos, causal=True)  # (1, 2, 4, 4)
    assert causal[0, 0, 3, 1].item() == pytest.approx(-2.0 ** -4 * 2)
    sym = alibi.score_bias(pos, pos, causal=False)
    assert sym[0, 1, 1, 3].item() == pytest.approx(-2.0 ** -8 * 2)


def test_rope_score_depends_only_on_offset():
    rope = RotaryEmbedding(16, rope_theta=10000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        cq, sq = rope.rotary(torch.tensor([[m]]))
        ck, sk = rope.rotary(torch.tensor([[n]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum().item()

    assert score(5, 2) == pytest.approx(score(103, 100), abs=1e-4)
    assert score(0, 7) == pytest.approx(score(20, 27), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-4)


def test_rope_tables_are_fp32_under_bf16_positions():
    rope = RotaryEmbedding(8).to(torch.bfloat16)
    cos, sin = rope.rotary(torch.tensor([[1000]]))
    assert cos.dtype == torch.float32 and rope.inv_freq.dtype == torch.float32
    x = torch.randn(1, 1, 1, 8, dtype=torch.bfloat16)
    assert apply_rotary(x, cos, sin).dtype == torch.bfloat16


def test_rope_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)


def test_learned_positions_raise_past_the_table():
    emb = LearnedPositionalEmbedding(4, 8)
    with pytest.raises(ValueError, match="max_positions"):
        emb.embed(torch.tensor([[4]]))


def test_apply_rotary_equals_the_textbook_formula_values_and_gradient():
    """The one-rotation autograd function = x * cos + rotate_half(x) * sin, forward and backward."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(8)
    positions = torch.tensor([[0, 1, 2, 5, 9], [3, 4, 5, 6, 7]])
    cos, sin = rope.rotary(positions)
    x = torch.randn(2, 3, 5, 8, requires_grad=True)

    def formula(t):
        t1, t2 = t.chunk(2, dim=-1)
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin

    g = torch.randn(2, 3, 5, 8)
    got, want = apply_rotary(x, cos, sin), formula(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(want, x, g)[0])
    # a rotation keeps the norm of every pair
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))


def test_rope_bf16_forward_and_gradients_within_bf16_tolerance_of_fp32():
    torch.manual_seed(2)
    rope = RotaryEmbedding(16)
    cos, sin = rope.rotary(torch.arange(9)[None])
    x = torch.randn(2, 4, 9, 16)
    x_low = x.bfloat16().requires_grad_()
    out = apply_rotary(x_low, cos, sin)
    x_ref = x_low.detach().float().requires_grad_()
    ref = apply_rotary(x_ref, cos, sin)
    g = torch.randn_like(ref)
    (gx,) = torch.autograd.grad(out, (x_low,), g.bfloat16())
    (rgx,) = torch.autograd.grad(ref, (x_ref,), g)
    assert out.dtype == gx.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gx.float(), rgx, rtol=1e-2, atol=3e-2)
