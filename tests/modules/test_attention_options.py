"""QK-norm and sliding-window masks of transformer.modules.attention, by value against HF
Qwen3Attention and the definition of Mistral's window; the rolling KV cache."""

from __future__ import annotations

import pytest
import torch

from transformer.models.builder import build_attention
from transformer.modules.attention_core import AttentionInputs, KVCache, build_attention_mask, window_keep
from transformer.modules.positions import ALiBi, RotaryEmbedding

D, H, HKV = 32, 4, 2


def _perturb(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return module.eval()


def test_qk_norm_against_hf_qwen3_attention() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3 import modeling_qwen3 as q3

    cfg = transformers.Qwen3Config(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=HKV,
        head_dim=D // H,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        attention_bias=False,
        max_position_embeddings=64,
        num_hidden_layers=1,
    )
    cfg._attn_implementation = "sdpa"
    hf = _perturb(q3.Qwen3Attention(cfg, 0))
    ours = build_attention(D, H, HKV, False, 0.0, qk_norm="rmsnorm", eps=1e-6).eval()
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.out_proj.load_state_dict(hf.o_proj.state_dict())
        ours.q_norm.load_state_dict(hf.q_norm.state_dict())
        ours.k_norm.load_state_dict(hf.k_norm.state_dict())
    x, pos = torch.randn(2, 9, D), torch.arange(9)[None].expand(2, 9)
    cos, sin = q3.Qwen3RotaryEmbedding(cfg)(x, pos)
    rope = RotaryEmbedding(head_dim=D // H, rope_theta=1e6).rotary(pos)
    with torch.no_grad():
        expected = hf(x, position_embeddings=(cos, sin), attention_mask=None)[0]
        got = ours(x, is_causal=True, rotary=rope)
        plain = build_attention(D, H, HKV, False, 0.0).eval()
        plain.in_proj.load_state_dict(ours.in_proj.state_dict())
        plain.out_proj.load_state_dict(ours.out_proj.state_dict())
        without = plain(x, is_causal=True, rotary=rope)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (without - expected).abs().max() > 1e-3  # the norms matter (their weights are perturbed)


def test_qk_norm_applies_to_cross_attention_keys_before_caching() -> None:
    attn = _perturb(build_attention(D, H, HKV, True, 0.0, qk_norm="layernorm"))
    x, memory = torch.randn(2, 1, D), torch.randn(2, 5, D)
    cache = KVCache(static=True)
    first = attn(x, memory=memory, cache=cache)
    k = attn.in_proj(memory)[..., H * 8 : (H + HKV) * 8].reshape(2, 5, HKV, 8).transpose(1, 2)
    torch.testing.assert_close(cache.k, attn.k_norm(k))
    torch.testing.assert_close(attn(x, cache=cache), first)
    assert (
        "q_norm.weight" in attn.state_dict()
        and "q_norm.weight" not in build_attention(D, H, HKV, True, 0.0).state_dict()
    )


@pytest.mark.parametrize("causal", [True, False])
def test_window_mask_is_mistrals_definition(causal: bool) -> None:
    """Causal: keep key j for query i iff ``i - W < j <= i`` (HF ``sliding_window_overlay`` and
    causal); bidirectional: ``|i - j| < W``."""
    W, T = 3, 7
    pos = torch.arange(T)[None]
    mask, is_causal = build_attention_mask(None, causal, T, T, keep=window_keep(pos, pos, W, causal))
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    expected = (j > i - W) & (j <= i) if causal else (i - j).abs() < W
    assert not is_causal and torch.equal(mask[0, 0], expected)


def test_rolling_cache_keeps_the_newest_entries() -> None:
    cache = KVCache(max_len=3)
    k = torch.arange(5.0).reshape(1, 1, 5, 1)
    k_all, _ = cache.extend(k[:, :, :4], k[:, :, :4])
    assert k_all.shape[2] == 4 and cache.k.flatten().tolist() == [1.0, 2.0, 3.0]
    k_all, _ = cache.extend(k[:, :, 4:], k[:, :, 4:])
    assert k_all.flatten().tolist() == [1.0, 2.0, 3.0, 4.0] and cache.k.flatten().tolist() == [2.0, 3.0, 4.0]
    assert len(cache) == 3


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_windowed_steps_over_a_rolling_cache_equal_the_full_forward(position: str) -> None:
    """Prefill of 5 then 6 single steps (past W=3) through a cache of 3 entries = one windowed pass;
    with left padding in row 0 and ALiBi's bias sliced like the mask."""
    W, T = 3, 11
    attn = _perturb(build_attention(D, H, HKV, True, 0.0))
    enc = RotaryEmbedding(head_dim=D // H) if position == "rope" else ALiBi(n_heads=H)
    x = torch.randn(2, T, D)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[0, :2] = True
    pos = (torch.arange(T)[None] - pad.sum(1, keepdim=True)).clamp(min=0)
    full_in = AttentionInputs.prepare(enc, pos, causal=True, key_padding_mask=pad, window=W)
    with torch.no_grad():
        full = attn(x, attn_mask=full_in.local_mask, rotary=full_in.rotary)
        cache, outs = KVCache(max_len=W), []
        for lo, hi in [(0, 5)] + [(t, t + 1) for t in range(5, T)]:
            step = AttentionInputs.prepare(
                enc, pos[:, lo:hi], pos[:, :hi], causal=True, key_padding_mask=pad[:, :hi], window=W
            )
            outs.append(attn(x[:, lo:hi], attn_mask=step.local_mask, rotary=step.rotary, cache=cache))
            assert len(cache) <= W
    real = ~pad
    torch.testing.assert_close(torch.cat(outs, 1)[real], full[real], atol=1e-5, rtol=1e-5)
    global_ = attn(x, attn_mask=full_in.mask, rotary=full_in.rotary)
    assert (global_ - full)[real].abs().max() > 1e-4  # the window changed the later rows
