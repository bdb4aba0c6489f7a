"""The attention switches (QK-norm, sliding windows, RoPE scaling) across the Hugging Face boundary: the
qwen3_style_tiny preset as Qwen3ForCausalLM (logits by value), a Qwen3 local/global layer pattern, RoPE
scaling exported to and imported from Llama (Llama 3.1 style), and refusals by name."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import REPO_ROOT, tiny_model_config
from tests.generation.helpers import make_run_dir
from tests.interop.helpers import LLAMA, perturbed
from transformer.config import register_configs
from transformer.interop import ExportError, export_run
from transformer.interop.ct2 import ct2_unsupported
from transformer.interop.hf_llama import (
    from_hf_llama,
    hf_llama_state,
    llama_unsupported,
    qwen3_unsupported,
    to_hf_llama,
)
from transformer.interop.hf_marian import marian_unsupported
from transformer.models import build_model

transformers = pytest.importorskip("transformers")


def _preset(name: str):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=[f"model={name}"]).model


def test_qwen3_preset_against_hf_qwen3(tmp_path) -> None:
    cfg = _preset("qwen3_style_tiny")
    assert cfg.qk_norm == "rmsnorm" and cfg.position.rope_theta == 1e6 and cfg.attention.name == "gqa"
    model = perturbed(build_model(cfg, 80))
    hf = to_hf_llama(model, cfg)
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    tokens = torch.randint(5, 80, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)
        hf.save_pretrained(tmp_path / "hf")
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(reloaded(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)


def test_local_global_pattern_against_hf_qwen3_layer_types() -> None:
    """model.attention_window_pattern=2 = Qwen3's layer_types [sliding, full, sliding, full]."""
    cfg = tiny_model_config(
        **{**LLAMA, "n_decoder_layers": 4, "qk_norm": "rmsnorm", "attention_window": 3, "attention_window_pattern": 2}
    )
    model = perturbed(build_model(cfg, 60))
    state = hf_llama_state(model, cfg)
    hf_cfg = transformers.Qwen3Config(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=state["model.layers.0.mlp.down_proj.weight"].shape[1],
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=cfg.norm.eps,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        tie_word_embeddings=False,
        use_sliding_window=True,
        sliding_window=3,
        max_window_layers=0,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    hf_cfg._attn_implementation = "sdpa"
    hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    assert not hf.load_state_dict(state, strict=False).missing_keys
    tokens = torch.randint(5, 60, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, atol=1e-4, rtol=0)


def test_qwen3_run_exports_as_a_qwen3_folder(tmp_path) -> None:
    run_dir, model, tok, _ = make_run_dir(
        tmp_path / "run",
        arch="decoder_only",
        qk_norm="rmsnorm",
        **{k: v for k, v in LLAMA.items() if k not in ("arch", "n_encoder_layers")},
    )
    out = export_run(run_dir, "hf", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.tensor([tok.encode("A man is riding a bike.") + [tok.sep_id] + tok.encode("Ein Mann")])
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, model(tokens), atol=1e-4, rtol=0)


SCALINGS = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 4,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 6},
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 4,
        "beta_fast": 8.0,
        "beta_slow": 2.0,
    },
}


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_scaled_rope_exports_to_llama_and_imports_back(kind: str, tmp_path) -> None:
    cfg = tiny_model_config(**LLAMA, **{f"position.rope_scaling.{k}": v for k, v in SCALINGS[kind].items()})
    model = perturbed(build_model(cfg, 60))
    tokens = torch.randint(5, 60, (2, 12), generator=torch.Generator().manual_seed(1))  # past the original length
    hf = to_hf_llama(model, cfg)
    assert hf.config.rope_parameters["rope_type"] == kind
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)
        unscaled = build_model(tiny_model_config(**LLAMA), 60).eval()
        unscaled.load_state_dict(model.state_dict())
        assert (unscaled(tokens) - ours).abs().max() > 1e-4  # the scaling changes the logits
    hf.save_pretrained(tmp_path / "hf")
    back, run_cfg = from_hf_llama(tmp_path / "hf")
    assert run_cfg.model.position.rope_scaling.rope_type == kind
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), ours, atol=1e-5, rtol=0)


def test_imports_a_llama_3_1_style_folder(tmp_path) -> None:
    """A random Llama-3.1-shaped config (rope_theta 500000, llama3 scaling with its published
    factors 8 / 1 / 4 / 8192) written by HF itself imports with equal logits."""
    hf_cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        bos_token_id=None,
        eos_token_id=3,
        pad_token_id=0,
    )
    hf = perturbed(transformers.LlamaForCausalLM(hf_cfg))
    hf.save_pretrained(tmp_path / "hf")
    model, run_cfg = from_hf_llama(tmp_path / "hf")
    rs = run_cfg.model.position.rope_scaling
    assert (rs.rope_type, rs.factor, rs.original_max_position_embeddings) == ("llama3", 8.0, 8192)
    tokens = torch.randint(5, 64, (2, 9))
    positions = torch.tensor([[0, 9000, 20000, 65000]])  # far positions, where llama3 scaling acts
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, atol=1e-4, rtol=0)
        cos, _ = model.embed.position.rotary(positions)
        hf_cos, _ = hf.model.rotary_emb(torch.zeros(1), positions)
        torch.testing.assert_close(cos[:, 0], hf_cos, atol=1e-5, rtol=0)


REFUSALS = [
    ({"attention.name": "mla", "attention.n_kv_heads": None}, "model/attention=mla", ["llama", "marian", "ct2"]),
    ({"attention_window": 4}, "model.attention_window=4", ["llama", "qwen3", "marian", "ct2"]),
    (
        {"position.rope_scaling.rope_type": "ntk", "position.rope_scaling.factor": 2.0},
        "model.position.rope_scaling.rope_type=ntk",
        ["llama", "qwen3", "ct2"],
    ),
    ({"qk_norm": "rmsnorm"}, "model.qk_norm=rmsnorm", ["llama", "marian", "ct2"]),
    ({"qk_norm": "layernorm"}, "model.qk_norm=layernorm", ["qwen3"]),
    ({"qk_norm": "rmsnorm", "bias": True}, "model.bias=true", ["qwen3"]),
]
CHECKS = {"llama": llama_unsupported, "qwen3": qwen3_unsupported, "marian": marian_unsupported, "ct2": ct2_unsupported}


@pytest.mark.parametrize("override,switch,targets", REFUSALS, ids=[r[1] for r in REFUSALS])
def test_options_without_a_counterpart_are_refused_by_name(override, switch, targets) -> None:
    cfg = tiny_model_config(**{**LLAMA, **override})
    for target in targets:
        assert any(why.startswith(switch) for why in CHECKS[target](cfg)), (target, CHECKS[target](cfg))
    if "llama" in targets and cfg.qk_norm == "none":
        with pytest.raises(ExportError, match=switch.replace(".", r"\.")):
            to_hf_llama(build_model(cfg, 40), cfg)


def test_defaults_add_no_refusal() -> None:
    """A config written before the new fields (no qk_norm, window or rope_scaling) is judged as before."""
    cfg = tiny_model_config(**LLAMA)
    assert llama_unsupported(cfg) == []
    old = OmegaConf.create(
        {
            k: v
            for k, v in OmegaConf.to_container(cfg).items()
            if k not in ("qk_norm", "attention_window", "attention_window_pattern")
        }
    )
    del old.position["rope_scaling"]
    assert llama_unsupported(old) == [] and ct2_unsupported(old) == []


def test_qwen3_folder_imports_back(tmp_path) -> None:
    cfg = _preset("qwen3_style_tiny")
    model = perturbed(build_model(cfg, 80))
    to_hf_llama(model, cfg).save_pretrained(tmp_path / "hf")
    back, run_cfg = from_hf_llama(tmp_path / "hf")
    assert run_cfg.model.qk_norm == "rmsnorm" and run_cfg.model.position.rope_theta == 1e6
    tokens = torch.randint(5, 80, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), model(tokens), atol=1e-5, rtol=0)
