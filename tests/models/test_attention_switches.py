"""The attention switches in whole models of both families: KV-cached greedy and beam
decoding equal to recomputing the full forward (MLA, sliding windows past W, QK-norm), a windowed
decoder-only model against HF MistralForCausalLM, layer patterns and the KV-cache sizes."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model_config
from tests.generation.helpers import RecomputeModel, Recorder, make_model, make_src
from tests.interop.helpers import LLAMA, perturbed
from transformer.config import layer_windows
from transformer.generation import beam_search, greedy_search
from transformer.interop.hf_llama import hf_llama_state
from transformer.models import build_model, kv_cache_bytes, kv_cache_bytes_per_token

ARCHS = ["encoder_decoder", "decoder_only"]
W = 3
OPTIONS = {
    "mla": {
        "attention.name": "mla",
        "attention.n_kv_heads": None,
        "position__name": "rope",
        "attention.kv_lora_rank": 12,
        "attention.q_lora_rank": 8,
    },
    "mla_sinusoidal": {"attention.name": "mla", "attention.n_kv_heads": None, "position__name": "sinusoidal"},
    "window": {"attention.name": "gqa", "attention.n_kv_heads": 2, "position__name": "rope", "attention_window": W},
    "window_pattern_alibi": {"position__name": "alibi", "attention_window": W, "attention_window_pattern": 2},
    "mla_window": {
        "attention.name": "mla",
        "attention.n_kv_heads": None,
        "position__name": "rope",
        "attention_window": W,
    },
    "qk_norm": {"attention.name": "gqa", "attention.n_kv_heads": 2, "position__name": "rope", "qk_norm": "rmsnorm"},
}


def _model(arch: str, option: str):
    return perturbed(
        make_model(arch, 40, eos_bias=1.0, scale=2.0, seed=3, norm_position="pre", **OPTIONS[option]), std=0.05
    )


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_greedy_and_beam_decoding_equal_recomputing(arch: str, option: str) -> None:
    model = _model(arch, option)
    src = make_src(arch, [7, 4, 9, 2], 40, seed=1)  # sources and outputs longer than W
    kw = dict(max_len_a=1.0, max_len_b=4, length_penalty_alpha=0.6)
    for search, extra in ((greedy_search, {}), (beam_search, {"beam_size": 3, "nbest": 2})):
        cached, reference = Recorder(model), Recorder(RecomputeModel(model))
        with torch.no_grad():
            a, b = search(cached, src, **kw, **extra), search(reference, src, **kw, **extra)
        assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b]
        assert max(len(hs[0].tokens) for hs in a) > W
        assert len(cached.logits) == len(reference.logits) > W
        for x, y in zip(cached.logits, reference.logits):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("option", ["window", "window_pattern_alibi", "mla_window"])
@pytest.mark.parametrize("arch", ARCHS)
def test_rolling_caches_hold_at_most_the_window(arch: str, option: str) -> None:
    model = _model(arch, option)
    with torch.no_grad():
        state = model.start_decoding(make_src(arch, [8, 6], 40))
        tokens = torch.full((2, 1), model.decoder_start_token_id)
        for _ in range(6):
            model.decode_step(tokens, state)
    windows = [layer.window for layer in model.decoder.layers]
    layers = {"n_encoder_layers": 0} if arch == "decoder_only" else {}
    model_cfg = tiny_model_config(arch=arch, **layers, **OPTIONS[option])
    assert windows == layer_windows(model_cfg, len(windows))
    for cache, window in zip(state.self_caches, windows):
        assert len(cache) == (W if window is not None else int(state.key_positions.shape[1]))
    n_layers = len(windows)
    per_token = kv_cache_bytes_per_token(model_cfg) // n_layers
    assert kv_cache_bytes(model_cfg, 100) == sum(min(100, w or 100) for w in windows) * per_token


def test_window_pattern_makes_every_nth_layer_global() -> None:
    cfg = tiny_model_config(attention_window=4, attention_window_pattern=3)
    assert layer_windows(cfg, 7) == [4, 4, None, 4, 4, None, 4]  # Gemma 3 style (pattern 6) at 3
    assert layer_windows(tiny_model_config(attention_window=4), 3) == [4, 4, 4]  # Mistral: all local
    assert layer_windows(tiny_model_config(), 3) == [None] * 3


def test_sliding_window_decoder_against_hf_mistral() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = tiny_model_config(**{**LLAMA, "attention_window": W})
    model = perturbed(build_model(cfg, 60))
    state = hf_llama_state(model, cfg)  # Mistral's parameter names are Llama's
    hidden = state["model.layers.0.mlp.down_proj.weight"].shape[1]
    hf_cfg = transformers.MistralConfig(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=cfg.norm.eps,
        rope_theta=cfg.position.rope_theta,
        sliding_window=W,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    hf_cfg._attn_implementation = "sdpa"
    hf = transformers.MistralForCausalLM(hf_cfg).eval()
    assert not hf.load_state_dict(state, strict=False).missing_keys
    tokens = torch.randint(5, 60, (2, 12))  # 4 times the window
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        got = model(tokens)
        unwindowed = build_model(tiny_model_config(**LLAMA), 60).eval()
        unwindowed.load_state_dict(model.state_dict())
        assert (unwindowed(tokens) - expected)[:, W:].abs().max() > 1e-3  # the window matters past W
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("option", ["mha", "mla", "mla_q_lora_v6", "mla_sinusoidal"])
def test_flops_of_latent_attention_match_a_flop_counter(option: str) -> None:
    """forward_flops counts the causal half of the attention square; torch's FlopCounterMode (math
    SDPA kernel: plain matmuls) counts all of it, so the two differ by ``layers * n^2 * (qk + v)``
    widths and by nothing else (every projection of MLA counted right)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from transformer.config import model_sizes
    from transformer.models import forward_flops

    kw = {
        "mha": {},
        "mla": OPTIONS["mla"],
        "mla_q_lora_v6": {**OPTIONS["mla"], "attention.v_head_dim": 6},
        "mla_sinusoidal": OPTIONS["mla_sinusoidal"],
    }[option]
    cfg = tiny_model_config(arch="decoder_only", n_encoder_layers=0, **kw)
    model = build_model(cfg, 50).eval()
    src_len, tgt_len = 4, 4
    n = src_len + 1 + tgt_len
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model(torch.randint(5, 50, (1, n)))
    sizes = model_sizes(cfg)
    lat = sizes.latent
    qk = sizes.n_heads * (lat.qk_head_dim if lat else sizes.head_dim)
    v = sizes.n_heads * (lat.v_head_dim if lat else sizes.head_dim)
    expected = forward_flops(cfg, 50, src_len, tgt_len)["total"] + cfg.n_decoder_layers * n * n * (qk + v)
    assert counter.get_total_flops() == expected
