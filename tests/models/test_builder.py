"""The builder: closed-form parameter counts, tying, FLOPs, and config validation."""

import re

import pytest

from tests.conftest import REPO_ROOT, tiny_model_config
from transformer.config import ConfigError, validate_model_config
from transformer.models import build_model, count_parameters, forward_flops, kv_cache_bytes_per_token


def _preset(name):
    """Compose a model preset with its nested defaults, as Hydra does."""
    from hydra import compose, initialize_config_dir

    from transformer.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=[f"model={name}"]).model


def _closed_form_2017(d, ff, layers, vocab):
    attn = 4 * (d * d + d)
    ffn = d * ff + ff + ff * d + d
    enc = layers * (attn + ffn + 2 * 2 * d)
    dec = layers * (2 * attn + ffn + 3 * 2 * d)
    return vocab * d + enc + dec


def test_transformer_2017_base_parameter_count():
    model = build_model(_preset("transformer_2017_base"), 37000)
    assert count_parameters(model) == _closed_form_2017(512, 2048, 6, 37000) == 63_082_496


def test_transformer_2017_big_parameter_count():
    model = build_model(_preset("transformer_2017_big"), 37000)
    assert count_parameters(model) == _closed_form_2017(1024, 4096, 6, 37000) == 214_245_376


def test_tying_modes():
    all_tied = build_model(tiny_model_config(tie_embeddings="all"), 50)
    assert all_tied.src_embed.embedding.weight is all_tied.tgt_embed.embedding.weight is all_tied.output_proj.weight
    dec = build_model(tiny_model_config(tie_embeddings="decoder"), 50, 60)
    assert dec.tgt_embed.embedding.weight is dec.output_proj.weight
    assert dec.src_embed.embedding.weight.shape[0] == 50 and dec.output_proj.out_features == 60
    none = build_model(tiny_model_config(tie_embeddings="none"), 50)
    assert (
        len({id(none.src_embed.embedding.weight), id(none.tgt_embed.embedding.weight), id(none.output_proj.weight)})
        == 3
    )


def test_llama_style_tiny_builds_with_gqa():
    cfg = _preset("llama_style_tiny")
    model = build_model(cfg, 8000)
    attn = model.decoder.layers[0].self_attn.sublayer
    assert (attn.n_heads, attn.n_kv_heads) == (4, 2) and len(model.decoder.layers) == 8
    assert model.decoder.layers[0].ffn.sublayer.w2.in_features == 344  # 2/3 * 512 -> multiple of 8


def test_flops_and_kv_cache_scale():
    cfg = tiny_model_config()
    f = forward_flops(cfg, 100, 10, 10)
    assert f["train_per_target_token"] == pytest.approx(3 * f["per_target_token"])
    mha = kv_cache_bytes_per_token(tiny_model_config(attention__name="mha"))
    gqa = kv_cache_bytes_per_token(tiny_model_config(attention__name="gqa", attention__n_kv_heads=2))
    mqa = kv_cache_bytes_per_token(tiny_model_config(attention__name="mqa"))
    assert (mha, gqa, mqa) == (mha, mha // 2, mha // 4)
    assert mha == 2 * 2 * 4 * 8 * 4  # K and V, 2 layers, 4 heads, head_dim 8, fp32


@pytest.mark.parametrize(
    "overrides,joint,message",
    [
        ({"d_model": 30, "n_heads": 4}, True, "model.d_model=30 is not divisible by model.n_heads=4"),
        (
            {"attention.name": "gqa", "attention.n_kv_heads": 3},
            True,
            "model.n_heads=4 is not divisible by model.attention.n_kv_heads=3",
        ),
        ({"d_model": 20, "n_heads": 4, "position.name": "rope"}, True, "= 5 is odd"),
        ({"tie_embeddings": "all"}, False, "data.joint_vocab=false"),
        ({"attention.name": "mha", "attention.n_kv_heads": 2}, True, "model/attention=mha"),
        ({"ffn.name": "swish"}, True, "model.ffn.name='swish' is not one of"),
    ],
)
def test_invalid_combinations_name_the_fields(overrides, joint, message):
    cfg = tiny_model_config(**overrides)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_model_config(cfg, joint_vocab=joint)
    with pytest.raises(ConfigError):
        build_model(cfg, 50, None if joint else 60)
