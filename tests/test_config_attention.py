"""Validation of the attention switches: every bad combination fails before anything is
built, with a sentence naming the fields (transformer.config.checks)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, tiny_model_config
from transformer.config import ConfigError, validate_model_config
from transformer.models import build_model

ROPE = {"position.name": "rope"}
MLA = {"attention.name": "mla", "attention.n_kv_heads": None, **ROPE}
BAD = [
    (
        {**MLA, "attention.qk_rope_head_dim": 3},
        "model/attention=mla with model/position=rope needs model.attention.qk_rope_head_dim even and > 0",
    ),
    ({**MLA, "attention.qk_rope_head_dim": 0}, "model.attention.qk_rope_head_dim even and > 0"),
    ({**MLA, "attention.kv_lora_rank": 0}, "model/attention=mla needs model.attention.kv_lora_rank > 0"),
    ({**MLA, "attention.v_head_dim": 0}, "model.attention.v_head_dim > 0"),
    ({**MLA, "attention.q_lora_rank": -4}, "model.attention.q_lora_rank=-4 must be > 0"),
    ({**MLA, "attention.n_kv_heads": 2}, "model/attention=mla needs n_kv_heads=null"),
    (
        {"attention.name": "mla", "attention.n_kv_heads": None, "attention.qk_rope_head_dim": 4},
        "model.attention.qk_rope_head_dim=4 is a rotated width but model/position=sinusoidal",
    ),
    ({**MLA, "qk_norm": "rmsnorm"}, "model.qk_norm=rmsnorm with model/attention=mla"),
    ({"qk_norm": "bogus"}, "model.qk_norm='bogus' is not one of none, layernorm, rmsnorm"),
    ({"attention_window": 0}, "model.attention_window=0 must be >= 1"),
    ({"attention_window": 4, "attention_window_pattern": 1}, "model.attention_window_pattern=1 must be 0"),
    ({"attention_window_pattern": 2}, "model.attention_window_pattern=2 needs model.attention_window"),
    (
        {
            "position.rope_scaling.rope_type": "llama3",
            "position.rope_scaling.factor": 8.0,
            "position.rope_scaling.original_max_position_embeddings": 64,
        },
        "model.position.rope_scaling.rope_type=llama3 scales RoPE but model/position=sinusoidal",
    ),
    (
        {**ROPE, "position.rope_scaling.rope_type": "yarn", "position.rope_scaling.factor": 4.0},
        "rope_type=yarn needs model.position.rope_scaling.original_max_position_embeddings",
    ),
    (
        {**ROPE, "position.rope_scaling.rope_type": "linear", "position.rope_scaling.factor": 0.5},
        "needs a finite model.position.rope_scaling.factor >= 1, got 0.5",
    ),
    (
        {**ROPE, "position.rope_scaling.rope_type": "linear", "position.rope_scaling.factor": float("inf")},
        "needs a finite model.position.rope_scaling.factor >= 1, got inf",
    ),
    (
        {
            **ROPE,
            "position.rope_scaling.rope_type": "yarn",
            "position.rope_scaling.factor": 4.0,
            "position.rope_scaling.original_max_position_embeddings": 64,
            "position.rope_scaling.attention_factor": -1.0,
        },
        "needs model.position.rope_scaling.attention_factor > 0 (or null), got -1.0",
    ),
    (
        {
            **ROPE,
            "position.rope_scaling.rope_type": "llama3",
            "position.rope_scaling.factor": 8.0,
            "position.rope_scaling.original_max_position_embeddings": 64,
            "position.rope_scaling.low_freq_factor": 4.0,
        },
        "needs 0 < model.position.rope_scaling.low_freq_factor < high_freq_factor",
    ),
    (
        {
            **ROPE,
            "position.rope_scaling.rope_type": "yarn",
            "position.rope_scaling.factor": 4.0,
            "position.rope_scaling.original_max_position_embeddings": 64,
            "position.rope_scaling.beta_slow": 40.0,
        },
        "needs 0 < model.position.rope_scaling.beta_slow < beta_fast",
    ),
    (
        {**ROPE, "position.rope_scaling.rope_type": "bogus"},
        "model.position.rope_scaling.rope_type='bogus' is not one of",
    ),
]


@pytest.mark.parametrize("override,message", BAD, ids=[m[:60] for _, m in BAD])
def test_bad_combinations_fail_before_anything_is_built(override: dict, message: str) -> None:
    cfg = tiny_model_config(**override)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_model_config(cfg)
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_model(cfg, 40)  # the builder validates first


GOOD = [
    {**MLA, "attention_window": 4},  # MLA with a rolling latent cache
    {"attention.name": "mla", "attention.n_kv_heads": None, "position.name": "alibi"},  # no decoupled key without RoPE
    {"position.name": "alibi", "attention_window": 4},  # ALiBi's bias is windowed like the mask
    {
        **ROPE,
        "qk_norm": "layernorm",
        "attention_window": 2,
        "attention_window_pattern": 2,
        "position.rope_scaling.rope_type": "dynamic",
        "position.rope_scaling.factor": 2.0,
    },
]


@pytest.mark.parametrize("override", GOOD)
def test_combinations_that_compose(override: dict) -> None:
    for arch in ("encoder_decoder", "decoder_only"):
        cfg = tiny_model_config(arch=arch, **override)
        validate_model_config(cfg)
        build_model(cfg, 40)


def test_train_script_stops_on_bad_mla_sizes_before_training(tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "scripts/train.py",
            "model=llama_style_tiny",
            "model/attention=mla",
            "model.attention.qk_rope_head_dim=5",
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert "model.attention.qk_rope_head_dim even and > 0" in out.stderr and "qk_rope_head_dim=5" in out.stderr
    assert not (tmp_path / "run" / "checkpoint_last.safetensors").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model/attention=gqa", "model.attention.kv_lora_rank=16"], "kv_lora_rank"),  # MLA's own field, not gqa's
        (["model.attention=gqa"], "model/attention=gqa"),  # the old flat form: one line naming the group form
    ],
)
def test_fields_of_another_option_and_the_flat_form_fail_naming_the_group(tmp_path, overrides, message) -> None:
    out = subprocess.run(
        [sys.executable, "scripts/train.py", *overrides, "train.max_updates=1", f"hydra.run.dir={tmp_path}/run"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode in (1, 2), out.stderr  # 2: ours; 1: Hydra's unknown-key error, which names the key
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()  # refused before Hydra wrote anything


def test_the_group_node_is_typed_by_the_chosen_option() -> None:
    from transformer.config import LatentAttentionConfig, to_config

    cfg = to_config({"model": {"attention": {"name": "mla", "kv_lora_rank": 16}}})
    assert isinstance(cfg.model.attention, LatentAttentionConfig) and cfg.model.attention.kv_lora_rank == 16
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        to_config({"model": {"attention": {"name": "gqa", "n_kv_heads": 2, "kv_lora_rank": 16}}})
    with pytest.raises(ConfigError, match="model/attention=<option>"):
        to_config({"model": {"attention": 7}})
