"""Decoder-only ``model/attention=mla`` models <-> Hugging Face DeepseekV3ForCausalLM
(transformer.interop.hf_moe, .hf_moe_import): the deepseek_style_tiny preset's logits on copied weights
(sigmoid routing, shared expert, selection bias), variants (dense MLA included), DeepSeek's interleaved RoPE
layout on import, the export folder (HF generate = our greedy search) and refusals by name."""

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
from transformer.interop.hf_moe import (
    DEEPSEEK_TARGET,
    MIXTRAL_TARGET,
    deepseek_unsupported,
    hf_moe_state,
    to_hf_moe,
)
from transformer.interop.hf_moe_import import from_hf_moe
from transformer.models import build_model

transformers = pytest.importorskip("transformers")

MLA = {**LLAMA, "attention.name": "mla", "attention.n_kv_heads": None, "norm.eps": 1e-6, "attention.kv_lora_rank": 16}
MOE = {**MLA, "ffn.name": "moe", "ffn.n_experts": 4, "ffn.top_k": 2, "ffn.router": "sigmoid", "ffn.n_shared_experts": 1}


def _preset(name: str):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=[f"model={name}"]).model


def _with_selection_bias(model):
    """Give every router a selection bias large enough to change which experts are chosen."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("router.expert_bias"):
                buf.copy_(torch.linspace(-0.3, 0.3, buf.numel()).roll(int(name.split(".")[2])))
    return model


def test_deepseek_preset_against_hf_deepseek_v3(tmp_path) -> None:
    cfg = _preset("deepseek_style_tiny")
    model = _with_selection_bias(perturbed(build_model(cfg, 80)))
    hf = to_hf_moe(model, cfg)
    assert type(hf).__name__ == "DeepseekV3ForCausalLM" and unsupported(cfg, "hf") == (DEEPSEEK_TARGET, [])
    c = hf.config
    assert (c.first_k_dense_replace, c.n_group, c.topk_group, c.rope_interleave) == (0, 1, 1, False)
    assert c.num_nextn_predict_layers == 0
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size) == (8, 2, 1, 176)
    assert (c.kv_lora_rank, c.q_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (64, 96, 32, 16, 32)
    assert (c.routed_scaling_factor, c.norm_topk_prob, c.rms_norm_eps) == (2.5, True, 1e-6)
    tokens = torch.randint(5, 80, (2, 21), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)
        for layer in hf.model.layers:  # the selection bias acts: without it HF chooses other experts
            layer.mlp.gate.e_score_correction_bias.zero_()
        assert (hf(input_ids=tokens).logits - ours).abs().max() > 1e-3
        hf = to_hf_moe(model, cfg)
        hf.save_pretrained(tmp_path / "hf")
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(reloaded(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)


VARIANTS = {
    "q_lora_shared_scaled": {**MOE, "attention.q_lora_rank": 12, "ffn.routed_scaling_factor": 2.5},
    "no_q_lora_no_shared_tied": {
        **MOE,
        "ffn.n_shared_experts": 0,
        "tie_embeddings": "all",
        "ffn.norm_topk_prob": False,
        "ffn.top_k": 1,
    },
    "geglu_two_shared_yarn_scaled": {
        **MOE,
        "ffn.expert": "geglu",
        "ffn.n_shared_experts": 2,
        "ffn.expert_d_ff": 24,
        "scale_embeddings": True,
        "position.rope_scaling.rope_type": "yarn",
        "position.rope_scaling.factor": 4.0,
        "position.rope_scaling.original_max_position_embeddings": 4,
    },
    "dense_mla": {**MLA, "attention.q_lora_rank": 12},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_against_hf_deepseek_v3_and_back(variant: str, tmp_path) -> None:
    cfg = tiny_model_config(**VARIANTS[variant])
    model = _with_selection_bias(perturbed(build_model(cfg, 60)))
    hf = to_hf_moe(model, cfg)
    assert hf.config.first_k_dense_replace == (2 if variant == "dense_mla" else 0)
    tokens = torch.randint(5, 60, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)
    hf.save_pretrained(tmp_path / "hf")
    back, run_cfg = from_hf_moe(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), ours, atol=1e-5, rtol=0)
    first, again = hf_moe_state(model, cfg), hf_moe_state(back, run_cfg.model)
    assert first.keys() == again.keys()
    for k in first:
        torch.testing.assert_close(again[k], first[k], atol=0, rtol=0)
    assert run_cfg.model.attention.name == "mla" and run_cfg.model.ffn.name == cfg.ffn.name


@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_imports_deepseeks_interleaved_rope_layout(q_lora_rank, tmp_path) -> None:
    """DeepSeek's checkpoints rotate interleaved pairs (rope_interleave=true); the import permutes
    those rows into our half-split layout, with HF's logits."""
    hf_cfg = transformers.DeepseekV3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=q_lora_rank,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=0,
        rope_interleave=True,
        num_mtp_layers=0,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=3,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    hf = perturbed(transformers.DeepseekV3ForCausalLM(hf_cfg))
    hf.save_pretrained(tmp_path / "hf")
    model, _ = from_hf_moe(tmp_path / "hf")
    tokens = torch.randint(5, 64, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def deepseek_run(tmp_path_factory):
    dec = {k: v for k, v in MOE.items() if k not in ("arch", "n_encoder_layers")}
    return make_run_dir(
        tmp_path_factory.mktemp("deepseek") / "run", arch="decoder_only", **{"attention.q_lora_rank": 12}, **dec
    )


def test_export_folder_generates_like_ours_and_imports_back(deepseek_run, tmp_path) -> None:
    run_dir, model, tok, _ = deepseek_run
    out = export_run(run_dir, "hf", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DeepseekV3ForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    gen = GenerationConfig(strategy="greedy", max_len_a=0.0, max_len_b=12)  # our latent cache against HF's
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
    assert back.cfg.model.attention.name == "mla" and back.cfg.model.ffn.router == "sigmoid"
    ids = [tok.encode(s) for s in ("A dog runs.", "Two women talk on a bench.")]
    beam = GenerationConfig(strategy="beam", beam_size=3, max_len_b=6)
    assert translate_sentences(back.model, ids, beam, "cpu") == translate_sentences(model, ids, beam, "cpu")


REFUSALS = [
    ({"ffn.router": "softmax"}, "model.ffn.router=softmax"),
    ({"norm.eps": 1e-5}, "model.norm.eps=1e-05 with model/attention=mla"),
    ({"bias": True}, "model.bias=true"),
    ({"attention_window": 4}, "model.attention_window=4"),
    ({"ffn.expert": "gelu"}, "model.ffn.expert=gelu"),
    ({"ffn.name": "relu"}, "model/ffn=relu"),
    (
        {"position.rope_scaling.rope_type": "ntk", "position.rope_scaling.factor": 2.0},
        "model.position.rope_scaling.rope_type=ntk",
    ),
    ({"norm_position": "post"}, "model.norm_position=post"),
]


@pytest.mark.parametrize("override,switch", REFUSALS, ids=[r[1] for r in REFUSALS])
def test_options_deepseek_v3_lacks_are_refused_by_name(override: dict, switch: str) -> None:
    assert_moe_export_refuses(
        tiny_model_config(**{**MOE, **override}), switch, deepseek_unsupported, DEEPSEEK_TARGET, "DeepseekV3ForCausalLM"
    )


def test_sigmoid_moe_without_mla_is_judged_as_mixtral_and_told_so() -> None:
    cfg = tiny_model_config(
        **{
            **{k: v for k, v in MOE.items() if not k.startswith("attention.")},
            "attention.name": "gqa",
            "attention.n_kv_heads": 2,
        }
    )
    assert any(
        w.startswith("model/attention=gqa: DeepseekV3ForCausalLM's attention is multi-head latent")
        for w in deepseek_unsupported(cfg)
    )
    target, why = unsupported(cfg, "hf")
    assert target == MIXTRAL_TARGET
    assert any(
        w.startswith(
            "model.ffn.router=sigmoid: Mixtral scores experts with softmax (DeepSeek-V3's sigmoid "
            "router exports as DeepseekV3ForCausalLM, with model/attention=mla)"
        )
        for w in why
    ), why


IMPORT_REFUSALS = [
    ({"first_k_dense_replace": 1}, "first_k_dense_replace=1 of 2 layers"),
    ({"n_group": 2, "topk_group": 1}, "n_group=2, topk_group=1"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"rms_norm_eps": 1e-5}, "rms_norm_eps=1e-05"),
    ({"num_key_value_heads": 2}, "num_key_value_heads=2"),
    (
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 500.0,
                "factor": 4.0,
                "mscale": 0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 8,
            }
        },
        "rope_parameters mscale_all_dim=1.0",
    ),
]


@pytest.mark.parametrize("override,reason", IMPORT_REFUSALS, ids=[r[1] for r in IMPORT_REFUSALS])
def test_import_refuses_what_our_model_lacks_by_name(override: dict, reason: str, tmp_path) -> None:
    hf_cfg = transformers.DeepseekV3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=0,
        rms_norm_eps=1e-6,
        num_mtp_layers=0,
        rope_interleave=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    for key, value in override.items():
        setattr(hf_cfg, key, value)
    hf_cfg.save_pretrained(tmp_path / "hf")  # the config is judged before any weight is read
    with pytest.raises(ExportError, match=f"cannot import .*{reason.replace('.', '[.]')}"):
        from_hf_moe(tmp_path / "hf")
