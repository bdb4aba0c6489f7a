"""Decoder-only ``model/ffn=moe`` models <-> Hugging Face MixtralForCausalLM (transformer.interop.hf_moe,
.hf_moe_import): the mixtral_style_tiny preset's logits on copied weights past its sliding window, variants, the
export folder (HF generate = our greedy search), the import back, and refusals by name."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.conftest import REPO_ROOT, tiny_model_config
from tests.generation.helpers import make_run_dir
from tests.interop.helpers import LLAMA, assert_moe_export_refuses, perturbed, random_sources
from transformer.config import GenerationConfig, register_configs
from transformer.generation import load_run, translate_sentences
from transformer.interop import ExportError, export_run, import_hf_llama, unsupported
from transformer.interop.hf_moe import MIXTRAL_TARGET, hf_moe_state, mixtral_unsupported, to_hf_moe
from transformer.interop.hf_moe_import import from_hf_moe
from transformer.models import build_model

transformers = pytest.importorskip("transformers")

MOE = {**LLAMA, "ffn.name": "moe", "ffn.n_experts": 4, "ffn.top_k": 2}


def _preset(name: str):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=[f"model={name}"]).model


def test_mixtral_preset_against_hf_mixtral(tmp_path) -> None:
    cfg = _preset("mixtral_style_tiny")
    model = perturbed(build_model(cfg, 80))
    hf = to_hf_moe(model, cfg)
    assert type(hf).__name__ == "MixtralForCausalLM" and unsupported(cfg, "hf") == (MIXTRAL_TARGET, [])
    c = hf.config
    assert (c.sliding_window, c.num_local_experts, c.num_experts_per_tok, c.num_key_value_heads) == (32, 8, 2, 2)
    assert (c.intermediate_size, c.num_hidden_layers, c.tie_word_embeddings) == (344, 8, False)
    tokens = torch.randint(5, 80, (2, 45), generator=torch.Generator().manual_seed(0))  # past the 32-token window
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)
        hf.config.sliding_window = None  # the window acts: global attention gives other logits
        assert (hf(input_ids=tokens).logits[:, 32:] - ours[:, 32:]).abs().max() > 1e-3
        hf.config.sliding_window = 32
        hf.save_pretrained(tmp_path / "hf")
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(reloaded(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)


VARIANTS = {
    "gqa_window_untied": {"attention_window": 4},
    "mha_geglu_tied_top3": {
        "attention.name": "mha",
        "attention.n_kv_heads": None,
        "ffn.expert": "geglu",
        "ffn.top_k": 3,
        "tie_embeddings": "all",
        "ffn.expert_d_ff": 48,
        "norm.eps": 1e-6,
    },
    "mqa_scaled_yarn": {
        "attention.name": "mqa",
        "attention.n_kv_heads": 1,
        "scale_embeddings": True,
        "ffn.glu_match_params": False,
        "position.rope_scaling.rope_type": "yarn",
        "position.rope_scaling.factor": 4.0,
        "position.rope_scaling.original_max_position_embeddings": 4,
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_against_hf_mixtral_and_back(variant: str, tmp_path) -> None:
    cfg = tiny_model_config(**{**MOE, **VARIANTS[variant]})
    model = perturbed(build_model(cfg, 60))
    hf = to_hf_moe(model, cfg)
    tokens = torch.randint(5, 60, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)
    hf.save_pretrained(tmp_path / "hf")  # HF writes its per-expert checkpoint tensors (experts.N.w1 ...)
    back, run_cfg = from_hf_moe(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), ours, atol=1e-5, rtol=0)
    first, again = hf_moe_state(model, cfg), hf_moe_state(back, run_cfg.model)
    assert first.keys() == again.keys()
    for k in first:  # an embedding scale is folded in once, then the imported model has none
        torch.testing.assert_close(again[k], first[k], atol=0, rtol=0)
    m = run_cfg.model
    assert (m.ffn.name, m.ffn.router, m.ffn.n_experts, m.ffn.top_k, m.ffn.expert) == (
        "moe",
        "softmax",
        4,
        cfg.ffn.top_k,
        cfg.ffn.expert,
    )
    assert (m.attention, m.attention_window) == (cfg.attention, cfg.attention_window)


@pytest.fixture(scope="module")
def mixtral_run(tmp_path_factory):
    dec = {k: v for k, v in MOE.items() if k not in ("arch", "n_encoder_layers")}
    return make_run_dir(tmp_path_factory.mktemp("mixtral") / "run", arch="decoder_only", attention_window=4, **dec)


def test_export_folder_generates_like_ours_and_imports_back(mixtral_run, tmp_path) -> None:
    run_dir, model, tok, _ = mixtral_run
    out = export_run(run_dir, "hf", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MixtralForCausalLM"]
    assert (out / "tokenizer.model").read_bytes() == (run_dir / "spm.model").read_bytes()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    # greedy decoding past the 4-token window: our rolling cache against HF's sliding-window cache
    gen = GenerationConfig(strategy="greedy", max_len_a=0.0, max_len_b=12)
    for src in random_sources(4, len(tok), seed=3):
        ours = translate_sentences(model, [src], gen, "cpu")[0][0].tokens
        with torch.inference_mode():
            out_ids = hf.generate(
                input_ids=torch.tensor([src + [tok.sep_id]]),
                max_new_tokens=13,
                do_sample=False,
                num_beams=1,
                eos_token_id=tok.eos_id,
                pad_token_id=tok.pad_id,
                bad_words_ids=[[tok.pad_id]],
                forced_eos_token_id=tok.eos_id,
            )
        assert out_ids[0, len(src) + 1 :].tolist() == ours
    back = load_run(import_hf_llama(out, tmp_path / "imported"))
    assert back.cfg.model.ffn.name == "moe" and back.cfg.generation.max_len_b == 5  # transformer_zoo.yaml
    ids = [tok.encode(s) for s in ("A dog runs.", "Two women talk on a bench.")]
    beam = GenerationConfig(strategy="beam", beam_size=3, max_len_b=6)
    assert translate_sentences(back.model, ids, beam, "cpu") == translate_sentences(model, ids, beam, "cpu")


REFUSALS = [
    ({"ffn.router": "sigmoid"}, "model.ffn.router=sigmoid"),
    ({"ffn.n_shared_experts": 1}, "model.ffn.n_shared_experts=1"),
    ({"ffn.norm_topk_prob": False}, "model.ffn.norm_topk_prob=false"),
    ({"ffn.routed_scaling_factor": 2.5}, "model.ffn.routed_scaling_factor=2.5"),
    ({"ffn.bias_update_speed": 0.001}, "model.ffn.bias_update_speed=0.001"),
    ({"ffn.expert": "relu"}, "model.ffn.expert=relu"),
    ({"bias": True}, "model.bias=true"),
    ({"qk_norm": "rmsnorm"}, "model.qk_norm=rmsnorm"),
    ({"attention_window": 4, "attention_window_pattern": 2}, "model.attention_window_pattern=2"),
    (
        {"position.rope_scaling.rope_type": "ntk", "position.rope_scaling.factor": 2.0},
        "model.position.rope_scaling.rope_type=ntk",
    ),
    ({"norm.name": "layernorm"}, "model/norm=layernorm"),
    ({"scale_embeddings": True, "tie_embeddings": "all"}, "model.scale_embeddings=true"),
]


@pytest.mark.parametrize("override,switch", REFUSALS, ids=[r[1] for r in REFUSALS])
def test_options_mixtral_lacks_are_refused_by_name(override: dict, switch: str) -> None:
    assert_moe_export_refuses(
        tiny_model_config(**{**MOE, **override}), switch, mixtral_unsupported, MIXTRAL_TARGET, "MixtralForCausalLM"
    )


def test_mla_and_dense_models_are_not_mixtral_and_a_trained_bias_is_refused() -> None:
    mla = tiny_model_config(**{**MOE, "attention.name": "mla", "attention.n_kv_heads": None})
    assert any(w.startswith("model/attention=mla") for w in mixtral_unsupported(mla))  # (exports as DeepSeek-V3)
    dense = tiny_model_config(**LLAMA)
    assert any(w.startswith("model/ffn=swiglu") for w in mixtral_unsupported(dense))
    cfg = tiny_model_config(**MOE)
    model = build_model(cfg, 40)
    model.decoder.layers[1].ffn.sublayer.router.expert_bias[0] = 0.1  # e.g. trained with bias_update_speed > 0
    with pytest.raises(ExportError, match=r"decoder\.layers\.1\.ffn\.sublayer\.router\.expert_bias is not zero"):
        to_hf_moe(model, cfg)


def test_import_refuses_router_jitter(tmp_path) -> None:
    cfg = tiny_model_config(**MOE)
    hf = to_hf_moe(perturbed(build_model(cfg, 40)), cfg)
    hf.config.router_jitter_noise = 0.1
    hf.save_pretrained(tmp_path / "hf")
    with pytest.raises(ExportError, match="router_jitter_noise=0.1: model/ffn=moe has no router jitter"):
        from_hf_moe(tmp_path / "hf")
