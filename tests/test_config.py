"""Hydra composition of every documented switch, typed validation and early failure."""

import dataclasses
import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from tests.conftest import REPO_ROOT
from transformer.config import (
    ConfigError,
    GenerationConfig,
    check_checkpoint_averaging,
    model_sizes,
    register_configs,
    validate_config,
    validate_model_config,
)
from transformer.models import build_model
from transformer.modules.attention import ATTENTION_KINDS
from transformer.modules.ffn import FFNS
from transformer.modules.norms import NORMS
from transformer.modules.positions import POSITIONS
from transformer.modules.residual import RESIDUALS
from transformer.plugins import plugin_of

SWITCHES = {
    "model=transformer_2017_base": ("model.d_model", 512),
    "model=transformer_2017_big": ("model.d_model", 1024),
    "model=transformer_tiny": ("model.d_model", 128),
    "model=llama_style": ("model.arch", "decoder_only"),
    "model=llama_style_tiny": ("model.attention.n_kv_heads", 2),
    "model.arch=decoder_only": ("model.arch", "decoder_only"),
    "model.norm_position=pre": ("model.norm_position", "pre"),
    "model/norm=rmsnorm": ("model.norm.name", "rmsnorm"),
    "model/ffn=swiglu": ("model.ffn.name", "swiglu"),
    "model/ffn=geglu": ("model.ffn.name", "geglu"),
    "model/ffn=gelu": ("model.ffn.name", "gelu"),
    "model/ffn=moe": ("model.ffn.name", "moe"),
    "model=llama_style_tiny model/ffn=moe model.ffn.n_experts=4 model.ffn.router=sigmoid": (
        "model.ffn.router",
        "sigmoid",
    ),
    "model/position=rope": ("model.position.name", "rope"),
    "model/position=alibi": ("model.position.name", "alibi"),
    "model/position=learned": ("model.position.name", "learned"),
    "model/position=none": ("model.position.name", "none"),
    "model/attention=gqa model.attention.n_kv_heads=2": ("model.attention.n_kv_heads", 2),
    "model/attention=mqa": ("model.attention.n_kv_heads", 1),
    "model.tie_embeddings=all": ("model.tie_embeddings", "all"),
    "model.tie_embeddings=none": ("model.tie_embeddings", "none"),
    "model=qwen3_style_tiny": ("model.qk_norm", "rmsnorm"),
    "model=mixtral_style_tiny": ("model.ffn.name", "moe"),
    "model=deepseek_style_tiny": ("model.attention.name", "mla"),
    "model/attention=mla": ("model.attention.name", "mla"),
    "model=llama_style_tiny model/attention=mla model.attention.kv_lora_rank=64 model.attention.q_lora_rank=48": (
        "model.attention.kv_lora_rank",
        64,
    ),
    "model.qk_norm=rmsnorm": ("model.qk_norm", "rmsnorm"),
    "model.attention_window=16": ("model.attention_window", 16),
    "model=llama_style_tiny model.attention_window=16 model.attention_window_pattern=2": (
        "model.attention_window_pattern",
        2,
    ),
    "model=llama_style_tiny model.position.rope_scaling.rope_type=llama3 model.position.rope_scaling.factor=8 "
    "model.position.rope_scaling.original_max_position_embeddings=256": (
        "model.position.rope_scaling.rope_type",
        "llama3",
    ),
}


def _compose(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_every_switch_composes_validates_and_builds(switch):
    cfg = _compose(switch.split())
    key, value = SWITCHES[switch]
    assert OmegaConf.select(cfg, key) == value
    validate_config(cfg)
    if cfg.model.d_model <= 128:
        build_model(cfg.model, 100)


def test_unknown_key_and_wrong_type_are_rejected_by_the_schema():
    with pytest.raises(ConfigCompositionException, match="d_modle"):
        _compose(["model.d_modle=3"])
    with pytest.raises(ConfigCompositionException, match="d_model"):
        _compose(["model.d_model=wide"])


MOE_ERRORS = [
    (["model.ffn.top_k=5", "model.ffn.n_experts=4"], r"model\.ffn\.top_k=5 is more than model\.ffn\.n_experts=4"),
    (["model.ffn.top_k=1"], r"model\.ffn\.top_k=1 with model\.ffn\.norm_topk_prob=true"),
    (["model.ffn.n_experts=0"], r"model\.ffn\.n_experts=0 and model\.ffn\.top_k=2 must be >= 1"),
    (["model.ffn.expert=moe"], r"model\.ffn\.expert='moe' is not one of relu, gelu, swiglu, geglu"),
    (["model.ffn.router=hash"], r"model\.ffn\.router='hash' is not one of softmax, sigmoid"),
    (["model.ffn.expert_d_ff=0"], r"model\.ffn\.expert_d_ff=0 positive"),
    (["model.ffn.routed_scaling_factor=0"], r"model\.ffn\.routed_scaling_factor=0\.0 must be > 0"),
    (["model.ffn.router_aux_loss_coef=-1"], r"model\.ffn\.router_aux_loss_coef=-1\.0 must be >= 0"),
    (["model.ffn.bias_update_speed=-0.1"], r"model\.ffn\.bias_update_speed=-0\.1 must be >= 0"),
]


@pytest.mark.parametrize("overrides,message", MOE_ERRORS, ids=[o[0] for o, _ in MOE_ERRORS])
def test_bad_moe_combinations_fail_before_anything_is_built_naming_the_fields(overrides, message):
    cfg = _compose(["model=llama_style_tiny", "model/ffn=moe", *overrides])
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg)
    with pytest.raises(ConfigError, match=message):  # the builder validates before building
        build_model(cfg.model, 100)


def test_moe_switch_composes_with_its_defaults_and_only_sets_its_name():
    cfg = _compose(["model/ffn=moe"])
    assert (cfg.model.ffn.n_experts, cfg.model.ffn.top_k, cfg.model.ffn.expert, cfg.model.ffn.router) == (
        8,
        2,
        "swiglu",
        "softmax",
    )
    option = OmegaConf.load(REPO_ROOT / "configs" / "model" / "ffn" / "moe.yaml")
    assert set(option) == {"name"}  # every other field defaults in FFNConfig
    # the expert fields do nothing for a dense block
    validate_config(_compose(["model.ffn.top_k=99"]))


def test_invalid_schedule_is_rejected():
    cfg = _compose(["lr_scheduler.warmup_updates=0"])
    with pytest.raises(ConfigError, match="warmup_updates"):
        validate_config(cfg)


CHECKPOINT_ERRORS = [
    (
        ["train.average_last=5"],
        r"train\.average_last=5 averages numbered checkpoints, which only train\.save_every > 0",
    ),
    (
        ["train.average_last=5", "train.save_every=100", "train.keep_last=3"],
        r"train\.average_last=5 cannot average more checkpoints than train\.keep_last=3",
    ),
]


@pytest.mark.parametrize("overrides,message", CHECKPOINT_ERRORS, ids=[" ".join(o) for o, _ in CHECKPOINT_ERRORS])
def test_an_average_of_checkpoints_the_run_never_keeps_is_refused_naming_the_fields(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_checkpoint_averaging(_compose(overrides).train)
    # what the studies use, and keep_last=0 (keep every one), pass
    check_checkpoint_averaging(_compose(["train.average_last=5", "train.save_every=100", "train.keep_last=5"]).train)
    check_checkpoint_averaging(_compose(["train.average_last=5", "train.save_every=100", "train.keep_last=0"]).train)


def test_cfg_job_prints_resolved_config_without_training():
    out = subprocess.run(
        [sys.executable, "scripts/train.py", "model/position=rope", "model/ffn=swiglu", "--cfg", "job"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    printed = OmegaConf.create(out.stdout)
    assert printed.model.position.name == "rope" and printed.model.ffn.name == "swiglu"


def test_invalid_config_exits_nonzero_before_training(tmp_path):
    out = subprocess.run(
        [sys.executable, "scripts/train.py", "model.n_heads=3", f"hydra.run.dir={tmp_path}/run"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "model.d_model=256 is not divisible by model.n_heads=3" in out.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_root_config_values_override_group_defaults_and_experiments_override_both():
    default = _compose([])
    assert default.optim.lr == 2e-3 and default.lr_scheduler.warmup_updates == 400  # train.yaml
    wu = _compose(["experiment=wu2021_tiny"])
    assert wu.optim.lr == 0.005 and wu.lr_scheduler.warmup_updates == 2000 and wu.model.d_model == 128
    assert _compose(["experiment=wu2021_tiny", "optim.lr=1e-3"]).optim.lr == 1e-3


# Each ladder step = the step before it + one switch; Hydra's recorded group choices (results.json
# "choices", the wandb run name) must name every switch the step has reached.
LADDER = [
    (
        "step0_vaswani2017",
        {"model/norm": "layernorm", "model/ffn": "relu", "model/position": "sinusoidal", "model/attention": "mha"},
        ("post", "encoder_decoder"),
    ),
    (
        "step1_pre_ln",
        {"model/norm": "layernorm", "model/ffn": "relu", "model/position": "sinusoidal", "model/attention": "mha"},
        ("pre", "encoder_decoder"),
    ),
    (
        "step2_rmsnorm",
        {"model/norm": "rmsnorm", "model/ffn": "relu", "model/position": "sinusoidal", "model/attention": "mha"},
        ("pre", "encoder_decoder"),
    ),
    (
        "step3_swiglu",
        {"model/norm": "rmsnorm", "model/ffn": "swiglu", "model/position": "sinusoidal", "model/attention": "mha"},
        ("pre", "encoder_decoder"),
    ),
    (
        "step4_rope",
        {"model/norm": "rmsnorm", "model/ffn": "swiglu", "model/position": "rope", "model/attention": "mha"},
        ("pre", "encoder_decoder"),
    ),
    (
        "step5_gqa",
        {"model/norm": "rmsnorm", "model/ffn": "swiglu", "model/position": "rope", "model/attention": "gqa"},
        ("pre", "encoder_decoder"),
    ),
    (
        "step6_decoder_only",
        {"model/norm": "rmsnorm", "model/ffn": "swiglu", "model/position": "rope", "model/attention": "gqa"},
        ("pre", "decoder_only"),
    ),
]


@pytest.mark.parametrize("step,choices,fields", LADDER, ids=[s for s, _, _ in LADDER])
def test_ladder_steps_compose_and_record_their_choices(step, choices, fields):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=ladder", f"ladder={step}"], return_hydra_config=True)
    recorded = {k: v for k, v in cfg.hydra.runtime.choices.items() if k in choices}
    assert recorded == choices
    assert (cfg.model.norm_position, cfg.model.arch) == fields
    # the recorded choice and the value agree (no field restated inline behind the group's back)
    assert cfg.model.norm.name == choices["model/norm"]
    assert cfg.model.ffn.name == choices["model/ffn"]
    assert cfg.model.position.name == choices["model/position"]
    assert cfg.model.attention.name == choices["model/attention"]
    assert cfg.train.max_tokens == (8192 if step == "step6_decoder_only" else 4096)
    validate_config(cfg)


SWITCH_TABLES = {
    "norm": (NORMS, "model.norm.name"),
    "ffn": (FFNS, "model.ffn.name"),
    "position": (POSITIONS, "model.position.name"),
    "attention": (ATTENTION_KINDS, "model.attention.name"),
}


@pytest.mark.parametrize("group", sorted(SWITCH_TABLES))
def test_each_switch_has_one_table_and_its_options_are_the_yaml_files(group):
    table, key = SWITCH_TABLES[group]
    files = sorted(p.stem for p in (REPO_ROOT / "configs" / "model" / group).glob("*.yaml"))
    assert files == sorted(name for name in table if plugin_of(f"model/{group}", name) is None)  # plugins: no YAML
    for name in files:  # each option file selects its own table entry
        assert OmegaConf.select(_compose([f"model/{group}={name}"]), key) == name
    with pytest.raises(ConfigError, match=f"{re.escape(key)}='bogus' is not one of {', '.join(table)}"):
        validate_model_config(
            OmegaConf.merge(_compose([]).model, OmegaConf.from_dotlist([f"{key[len('model.') :]}=bogus"]))
        )


def test_norm_position_options_are_the_residual_table():
    assert tuple(RESIDUALS) == ("post", "pre")
    assert RESIDUALS["pre"].final_norm and not RESIDUALS["post"].final_norm
    with pytest.raises(ConfigError, match="model.norm_position='middle' is not one of post, pre"):
        validate_model_config(OmegaConf.merge(_compose([]).model, {"norm_position": "middle"}))


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["model=transformer_tiny"], dict(head_dim=32, n_kv_heads=4, ffn_hidden=256, ffn_matrices=2)),
        (["model=llama_style_tiny"], dict(head_dim=32, n_kv_heads=2, ffn_hidden=344, ffn_matrices=3)),
        (["model=llama_style_tiny", "model.ffn.glu_match_params=false"], dict(ffn_hidden=512, ffn_matrices=3)),
        (["model=transformer_tiny", "model/attention=mqa"], dict(n_kv_heads=1)),
        (["model=llama_style_tiny", "model/attention=mla"], dict(head_dim=32, n_kv_heads=4, ffn_hidden=344)),
    ],
)
def test_model_sizes_are_derived_in_one_place_and_match_the_built_model(overrides, expected):
    cfg = _compose(overrides).model
    sizes = model_sizes(cfg)
    assert {k: getattr(sizes, k) for k in expected} == expected
    layer = build_model(cfg, 100).decoder.layers[0]
    attn, ffn = layer.self_attn.sublayer, layer.ffn.sublayer
    if sizes.latent is not None:  # MLA: the latent sizes, derived from head_dim in DeepSeek-V2's proportions
        assert (attn.kv_lora_rank, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim) == (
            4 * sizes.head_dim,
            sizes.head_dim,
            sizes.head_dim // 2,
            sizes.head_dim,
        )
    else:
        assert (attn.head_dim, attn.n_kv_heads) == (sizes.head_dim, sizes.n_kv_heads)
    assert ffn.w2.in_features == sizes.ffn_hidden
    assert sum(p.numel() for n, p in ffn.named_parameters() if n.endswith("weight")) == (
        sizes.ffn_matrices * sizes.d_model * sizes.ffn_hidden
    )


@pytest.mark.parametrize(
    "child,parent",
    [
        ("llama_style_tiny", "llama_style"),
        ("qwen3_style_tiny", "llama_style_tiny"),
        ("mixtral_style_tiny", "llama_style_tiny"),
        ("deepseek_style_tiny", "llama_style_tiny"),
        ("transformer_tiny", "transformer_2017_base"),
        ("transformer_2017_base", "transformer_small"),  # transformer_small is ModelConfig's defaults
        ("transformer_2017_big", "transformer_2017_base"),
    ],
)
def test_presets_are_their_parent_plus_their_own_lines(child, parent):
    """A preset is its parent, the group options it overrides in its defaults list (``- override
    ffn: moe``, so that Hydra records the choice) and its own lines, nothing else."""
    own = OmegaConf.load(REPO_ROOT / "configs" / "model" / f"{child}.yaml")
    defaults = list(own.defaults)
    assert defaults[0] == parent and defaults[-1] == "_self_"
    overrides = [next(iter(entry.items())) for entry in defaults[1:-1]]  # ("override ffn", "moe")
    assert all(key.split()[0] == "override" and key.split()[1] in SWITCH_TABLES for key, _ in overrides), overrides
    choices = [f"model/{key.split()[1]}={option}" for key, option in overrides]
    own.pop("defaults")
    parent_cfg = _compose([f"model={parent}", *choices])
    child_cfg = _compose([f"model={child}"])
    assert child_cfg.model == OmegaConf.merge(parent_cfg.model, own)
    for group in ("norm", "ffn", "position", "attention"):  # the parent's switches, still switchable
        if group in own and group == "attention":  # the preset sets its option's own fields (MLA's latent sizes)
            continue
        assert OmegaConf.select(
            _compose([f"model={child}", f"model/{group}={next(iter(SWITCH_TABLES[group][0]))}"]),
            SWITCH_TABLES[group][1],
        ) == next(iter(SWITCH_TABLES[group][0]))


@pytest.mark.parametrize(
    "preset,choices",
    [
        ("mixtral_style_tiny", {"model/ffn": "moe", "model/attention": "gqa"}),
        ("deepseek_style_tiny", {"model/ffn": "moe", "model/attention": "mla"}),
    ],
)
def test_moe_presets_record_their_group_choices_and_sizes(preset, choices):
    """Hydra records the options a preset overrides (results.json's ``choices``, the run names), and
    the sizes are the ones its file states."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"model={preset}"], return_hydra_config=True)
    assert {k: cfg.hydra.runtime.choices[k] for k in choices} == choices
    sizes = model_sizes(cfg.model)
    assert (sizes.d_model, sizes.n_heads, sizes.n_experts, sizes.top_k) == (128, 4, 8, 2)
    if preset == "mixtral_style_tiny":
        assert (cfg.model.ffn.router, sizes.n_kv_heads, sizes.ffn_hidden, sizes.shared_hidden) == ("softmax", 2, 344, 0)
        assert (cfg.model.attention_window, cfg.model.attention_window_pattern) == (32, 0)
    else:
        f = cfg.model.ffn
        assert (f.router, f.routed_scaling_factor, f.bias_update_speed) == ("sigmoid", 2.5, 0.001)
        assert (sizes.ffn_hidden, sizes.shared_hidden, f.router_aux_loss_coef) == (176, 176, 0.0)
        assert (sizes.latent.kv_lora_rank, sizes.latent.q_lora_rank, sizes.latent.qk_rope_head_dim) == (64, 96, 16)
        assert cfg.model.attention_window is None and cfg.model.norm.eps == 1e-6


@pytest.mark.parametrize("script", ["translate", "evaluate"])
def test_script_generation_fields_are_the_generation_schema_all_null(script):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name=script, overrides=["generation.beam_size=10"])
    names = [f.name for f in dataclasses.fields(GenerationConfig)]
    assert list(cfg.generation) == names
    assert {k: v for k, v in cfg.generation.items() if v is not None} == {"beam_size": 10}
    with pytest.raises(ConfigCompositionException, match="beam_size"):
        with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
            compose(config_name=script, overrides=["generation.beam_size=ten"])
