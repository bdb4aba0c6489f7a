"""Multi-head latent attention (transformer.modules.mla) by value against HF DeepseekV3Attention,
its KV cache (the latent and the shared RoPE key only) and cached decoding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import tiny_model_config
from transformer.config import LatentSizes, model_sizes
from transformer.models import build_model, kv_cache_bytes_per_token
from transformer.models.builder import build_mla
from transformer.modules.attention_core import KVCache, build_attention_mask
from transformer.modules.mla import MultiHeadLatentAttention
from transformer.modules.positions import RotaryEmbedding
from transformer.modules.rope_scaling import RopeScaling

D, H = 32, 4
SIZES = {
    "no_q_lora": LatentSizes(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12),
    "q_lora": LatentSizes(kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=8),
}
ROPES = {"default": None, "yarn": RopeScaling(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)}


def _perturbed(module: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return module.eval()


def _hf_attention(sizes: LatentSizes, bias: bool, scaling: RopeScaling | None):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if scaling is not None:
        rope = {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": scaling.factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    cfg = transformers.DeepseekV3Config(
        vocab_size=50,
        hidden_size=D,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=H,
        num_key_value_heads=H,
        kv_lora_rank=sizes.kv_lora_rank,
        q_lora_rank=sizes.q_lora_rank,
        qk_rope_head_dim=sizes.qk_rope_head_dim,
        qk_nope_head_dim=sizes.qk_nope_head_dim,
        v_head_dim=sizes.v_head_dim,
        rope_interleave=False,
        rms_norm_eps=1e-6,
        attention_bias=bias,
        max_position_embeddings=64,
        rope_parameters=rope,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
    )
    cfg._attn_implementation = "sdpa"
    return _perturbed(ds.DeepseekV3Attention(cfg, 0)), ds.DeepseekV3RotaryEmbedding(cfg)


def _copy_from_hf(ours: MultiHeadLatentAttention, hf: nn.Module) -> None:
    with torch.no_grad():
        if isinstance(ours.q_proj, nn.Sequential):
            for mine, theirs in zip(ours.q_proj, (hf.q_a_proj, hf.q_a_layernorm, hf.q_b_proj)):
                mine.load_state_dict(theirs.state_dict())
        else:
            ours.q_proj.load_state_dict(hf.q_proj.state_dict())
        ours.kv_down.load_state_dict(hf.kv_a_proj_with_mqa.state_dict())
        ours.kv_norm.load_state_dict(hf.kv_a_layernorm.state_dict())
        ours.kv_up.load_state_dict(hf.kv_b_proj.state_dict())
        ours.out_proj.load_state_dict(hf.o_proj.state_dict())


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("variant", list(SIZES))
def test_against_hf_deepseek_v3_attention(variant: str, bias: bool, rope: str) -> None:
    sizes, scaling = SIZES[variant], ROPES[rope]
    hf, hf_rotary = _hf_attention(sizes, bias, scaling)
    ours = build_mla(D, H, sizes, bias, 0.0, 1e-6).eval()
    _copy_from_hf(ours, hf)
    x = torch.randn(2, 11, D)  # longer than yarn's original length 8
    pos = torch.arange(11)[None].expand(2, 11)
    cos, sin = hf_rotary(x, pos)
    table = RotaryEmbedding(head_dim=sizes.qk_rope_head_dim, scaling=scaling).rotary(pos)
    torch.testing.assert_close(table[0][:, 0], cos)  # the same (scaled) RoPE tables
    torch.testing.assert_close(table[1][:, 0], sin)
    with torch.no_grad():
        expected = hf(x, position_embeddings=(cos, sin), attention_mask=None)[0]  # causal
        got = ours(x, is_causal=True, rotary=table)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_cache_holds_the_latent_and_the_rope_key_only() -> None:
    cfg = tiny_model_config(
        arch="decoder_only",
        n_encoder_layers=0,
        attention__name="mla",
        position__name="rope",
        attention__kv_lora_rank=12,
        attention__qk_rope_head_dim=4,
    )
    latent = model_sizes(cfg).latent
    model = build_model(cfg, 40).eval()
    with torch.no_grad():
        state = model.start_decoding(torch.randint(5, 40, (3, 6)))
    cache = state.self_caches[0]
    assert cache.k.shape == (3, 1, 6, 12) and cache.v.shape == (3, 1, 6, 4)  # latent, shared rotated key
    per_token_and_layer = (cache.k[0, :, 0].numel() + cache.v[0, :, 0].numel()) * cache.k.element_size()
    assert per_token_and_layer == (latent.kv_lora_rank + latent.qk_rope_head_dim) * 4
    assert kv_cache_bytes_per_token(cfg) == cfg.n_decoder_layers * per_token_and_layer


def test_cached_chunks_equal_the_full_forward() -> None:
    """Prefill chunks of 3 and 2 queries, then single steps over the latent cache = one causal pass."""
    sizes = SIZES["q_lora"]
    attn = _perturbed(build_mla(D, H, sizes, True, 0.0, 1e-6))
    rope = RotaryEmbedding(head_dim=sizes.qk_rope_head_dim)
    x, pos = torch.randn(2, 7, D), torch.arange(7)[None]
    with torch.no_grad():
        full = attn(x, is_causal=True, rotary=rope.rotary(pos))
        cache, outs, start = KVCache(), [], 0
        for size in (3, 2, 1, 1):
            mask, causal = build_attention_mask(None, True, size, start + size)
            outs.append(
                attn(
                    x[:, start : start + size],
                    attn_mask=mask,
                    is_causal=causal,
                    rotary=rope.rotary(pos[:, start : start + size]),
                    cache=cache,
                )
            )
            start += size
    assert len(cache) == 7 and cache.k.shape[-1] == sizes.kv_lora_rank
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)


def test_sizes_are_checked_and_cross_attention_is_refused() -> None:
    sizes = SIZES["no_q_lora"]
    good = build_mla(D, H, sizes, False, 0.0, 1e-6)
    with pytest.raises(ValueError, match="kv_up inputs"):
        MultiHeadLatentAttention(
            n_heads=H,
            kv_lora_rank=8,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=12,
            q_proj=good.q_proj,
            kv_down=nn.Linear(D, 16),
            kv_norm=good.kv_norm,
            kv_up=good.kv_up,
            out_proj=good.out_proj,
        )
    with pytest.raises(ValueError, match="even qk_rope_head_dim"):
        build_mla(D, H, LatentSizes(16, None, 8, 7, 12), False, 0.0, 1e-6)
    with pytest.raises(ValueError, match="self-attention only"):
        good(torch.randn(1, 2, D), memory=torch.randn(1, 3, D))
