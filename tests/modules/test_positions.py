"""Position encodings checked by value against the papers' formulas."""

import math

import pytest
import torch

from transformer.kernels.rotary import apply_rotary
from transformer.modules.positions import (
    POSITIONS,
    ALiBi,
    LearnedPositionalEmbedding,
    NoPositions,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_slopes,
    sinusoidal_table,
)
from transformer.plugins import ORIGINS


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (50, 10), (99, 31)])
def test_sinusoidal_table_equals_paper_formula(pos, i):
    d_model = 64
    table = sinusoidal_table(100, d_model)
    angle = pos / 10000 ** (2 * i / d_model)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_embedding_extends_beyond_table():
    emb = SinusoidalPositionalEmbedding(d_model=16, max_positions=4)
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
    alibi = ALiBi(n_heads=2)
    pos = torch.arange(4)[None]
    causal = alibi.score_bias(pos, pos, causal=True)  # (1, 2, 4, 4)
    assert causal[0, 0, 3, 1].item() == pytest.approx(-(2.0**-4) * 2)
    sym = alibi.score_bias(pos, pos, causal=False)
    assert sym[0, 1, 1, 3].item() == pytest.approx(-(2.0**-8) * 2)


def test_rope_score_depends_only_on_offset():
    rope = RotaryEmbedding(head_dim=16, rope_theta=10000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        cq, sq = rope.rotary(torch.tensor([[m]]))
        ck, sk = rope.rotary(torch.tensor([[n]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum().item()

    assert score(5, 2) == pytest.approx(score(103, 100), abs=1e-4)
    assert score(0, 7) == pytest.approx(score(20, 27), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-4)


def test_rope_tables_are_fp32_under_bf16_positions():
    rope = RotaryEmbedding(head_dim=8).to(torch.bfloat16)
    cos, sin = rope.rotary(torch.tensor([[1000]]))
    assert cos.dtype == torch.float32 and rope.inv_freq.dtype == torch.float32
    x = torch.randn(1, 1, 1, 8, dtype=torch.bfloat16)
    assert apply_rotary(x, cos, sin).dtype == torch.bfloat16


def test_rope_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(head_dim=7)


def test_learned_positions_raise_past_the_table():
    emb = LearnedPositionalEmbedding(max_positions=4, d_model=8)
    with pytest.raises(ValueError, match="max_positions"):
        emb.embed(torch.tensor([[4]]))


def test_every_position_is_built_from_sizes_by_the_base_class_with_the_keywords_it_names():
    """One ``from_sizes`` (the base class's): each built-in class names its constructor's keywords."""
    built_in = {name: cls for name, cls in POSITIONS.items() if ("model/position", name) not in ORIGINS}
    assert [name for name, cls in built_in.items() if "from_sizes" in vars(cls)] == []
    sizes = dict(d_model=16, n_heads=4, max_positions=12, rope_theta=500.0)
    torch.manual_seed(0)
    learned = LearnedPositionalEmbedding.from_sizes(**sizes)
    torch.manual_seed(0)
    assert torch.equal(learned.weight, LearnedPositionalEmbedding(max_positions=12, d_model=16).weight)
    assert SinusoidalPositionalEmbedding.from_sizes(**sizes).table.shape == (12, 16)
    rope = RotaryEmbedding.from_sizes(**sizes)
    assert (rope.head_dim, rope.rope_theta, rope.scaling) == (4, 500.0, None)
    assert RotaryEmbedding.from_sizes(**sizes, rotary_dim=2).head_dim == 2
    assert ALiBi.from_sizes(**sizes).slopes.shape == (4,)
    assert type(NoPositions.from_sizes(**sizes)) is NoPositions
