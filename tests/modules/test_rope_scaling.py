"""RoPE scaling (transformer.modules.rope_scaling): inverse frequencies and attention factors by
value against Hugging Face's ROPE_INIT_FUNCTIONS, and the rotary tables built from them."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.modules.positions import RotaryEmbedding
from transformer.modules.rope_scaling import ROPE_SCALINGS, RopeScaling, rope_inv_freq, unscaled_inv_freq

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIM, THETA, L0 = 64, 500000.0, 64
CASES = {
    "linear": RopeScaling(rope_type="linear", factor=4.0),
    "yarn": RopeScaling(
        rope_type="yarn", factor=8.0, original_max_position_embeddings=L0, beta_fast=32.0, beta_slow=1.0
    ),
    "yarn_attention_factor": RopeScaling(
        rope_type="yarn",
        factor=4.0,
        original_max_position_embeddings=L0,
        beta_fast=16.0,
        beta_slow=2.0,
        attention_factor=1.5,
    ),
    "llama3": RopeScaling(
        rope_type="llama3", factor=8.0, original_max_position_embeddings=L0, low_freq_factor=1.0, high_freq_factor=4.0
    ),
}


def _hf_config(s: RopeScaling, max_positions: int = 4 * L0):
    params = {"rope_type": s.rope_type, "rope_theta": THETA, "factor": s.factor}
    if s.rope_type == "yarn":
        params.update(
            original_max_position_embeddings=s.original_max_position_embeddings,
            beta_fast=s.beta_fast,
            beta_slow=s.beta_slow,
            **({} if s.attention_factor is None else {"attention_factor": s.attention_factor}),
        )
    if s.rope_type == "llama3":
        params.update(
            original_max_position_embeddings=s.original_max_position_embeddings,
            low_freq_factor=s.low_freq_factor,
            high_freq_factor=s.high_freq_factor,
        )
    return transformers.LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_positions,
        rope_parameters=params,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_inverse_frequencies_and_attention_factor_equal_hf(case: str) -> None:
    s = CASES[case]
    expected, expected_factor = ROPE_INIT_FUNCTIONS[s.rope_type](_hf_config(s), "cpu")
    got, factor = rope_inv_freq(HEAD_DIM, THETA, s)
    torch.testing.assert_close(got, expected.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-12)
    assert not torch.allclose(got, unscaled_inv_freq(HEAD_DIM, THETA).float())  # the scaling did something


@pytest.mark.parametrize("length", [L0 // 2, L0, 3 * L0])
def test_dynamic_ntk_equals_hf_at_the_input_length(length: int) -> None:
    """HF's ``dynamic`` at ``seq_len`` = our table for positions 0..length-1 (L0 = HF's max_position_embeddings)."""
    s = RopeScaling(rope_type="dynamic", factor=4.0, original_max_position_embeddings=L0)
    expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](_hf_config(s, max_positions=L0), "cpu", seq_len=length)
    rope = RotaryEmbedding(head_dim=HEAD_DIM, rope_theta=THETA, scaling=s)
    pos = torch.arange(length)[None]
    cos, sin = rope.rotary(pos)
    angles = pos[0, :, None].double() * expected.double()
    torch.testing.assert_close(cos[0, 0, :, : HEAD_DIM // 2], angles.cos().float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin[0, 0, :, : HEAD_DIM // 2], angles.sin().float(), rtol=1e-5, atol=1e-5)
    unscaled = RotaryEmbedding(head_dim=HEAD_DIM, rope_theta=THETA).rotary(pos)
    assert torch.equal(cos, unscaled[0]) == (length <= L0)  # scaled only past the original length


def test_static_ntk_raises_the_base_as_the_formula() -> None:
    """``ntk``: base ``theta * s^(d/(d-2))`` (bloc97 2023); HF's ``dynamic`` gives the same base at the
    length where its stretch ``s * L / L0 - (s - 1)`` equals ``s``, i.e. ``L = L0 (2s - 1) / s``."""
    s = RopeScaling(rope_type="ntk", factor=2.0)
    got, factor = rope_inv_freq(HEAD_DIM, THETA, s)
    base = THETA * 2.0 ** (HEAD_DIM / (HEAD_DIM - 2))
    torch.testing.assert_close(got, torch.tensor([base ** (-2 * i / HEAD_DIM) for i in range(HEAD_DIM // 2)]).float())
    hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](_hf_config(s, max_positions=L0), "cpu", seq_len=L0 * 3 // 2)
    torch.testing.assert_close(got, hf.float(), rtol=1e-6, atol=0)
    assert factor == 1.0


def test_yarn_attention_factor_scales_the_tables() -> None:
    s = CASES["yarn"]
    pos = torch.arange(5)[None]
    scaled = RotaryEmbedding(head_dim=HEAD_DIM, rope_theta=THETA, scaling=s).rotary(pos)
    inv_freq, factor = rope_inv_freq(HEAD_DIM, THETA, s)
    assert factor == pytest.approx(0.1 * math.log(8.0) + 1.0)  # Peng et al. 2023, eq. 22
    angles = pos[0, :, None].float() * inv_freq
    torch.testing.assert_close(scaled[0][0, 0, :, : HEAD_DIM // 2], angles.cos() * factor)


def test_default_is_the_unscaled_table_and_every_option_is_callable() -> None:
    pos = torch.arange(7)[None]
    plain = RotaryEmbedding(head_dim=16).rotary(pos)
    default = RotaryEmbedding(head_dim=16, scaling=RopeScaling()).rotary(pos)
    assert all(torch.equal(a, b) for a, b in zip(plain, default))
    for name in ROPE_SCALINGS:
        inv, _ = rope_inv_freq(
            16, 10000.0, RopeScaling(rope_type=name, factor=2.0, original_max_position_embeddings=32)
        )
        assert inv.shape == (8,) and inv.dtype == torch.float32
    with pytest.raises(ValueError, match="rope_type='bogus'"):
        rope_inv_freq(16, 10000.0, RopeScaling(rope_type="bogus"))
