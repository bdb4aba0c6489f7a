"""Faithfulness: our layers and presets equal reference implementations on copied weights."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from tests.conftest import REPO_ROOT, tiny_model_config
from transformer.models import build_model
from transformer.models.builder import _build_stack
from transformer.modules.attention_core import AttentionInputs

D, H, FF = 32, 4, 64


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.copy_(theirs.in_proj_weight)
    ours.in_proj.bias.copy_(theirs.in_proj_bias)
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())


def _copy_ffn(ours, theirs) -> None:
    ours.w1.load_state_dict(theirs.linear1.state_dict())
    ours.w2.load_state_dict(theirs.linear2.state_dict())


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_layer_matches_torch(norm_position):
    cfg = tiny_model_config(norm_position=norm_position)
    ours = _build_stack(cfg, 1, H, cross=False).layers[0].eval()
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_position == "pre").eval()
    with torch.no_grad():
        _copy_attention(ours.self_attn.sublayer, ref.self_attn)
        _copy_ffn(ours.ffn.sublayer, ref)
        ours.self_attn.norm.load_state_dict(ref.norm1.state_dict())
        ours.ffn.norm.load_state_dict(ref.norm2.state_dict())
    x = torch.randn(3, 7, D)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    expected = ref(x, src_key_padding_mask=pad)
    got = ours(x, AttentionInputs(mask=~pad[:, None, None, :]))
    real = ~pad
    assert (got - expected)[real].abs().max().item() <= 1e-5


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_layer_matches_torch(norm_position):
    cfg = tiny_model_config(norm_position=norm_position)
    ours = _build_stack(cfg, 1, H, cross=True).layers[0].eval()
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_position == "pre").eval()
    with torch.no_grad():
        _copy_attention(ours.self_attn.sublayer, ref.self_attn)
        _copy_attention(ours.cross_attn.sublayer, ref.multihead_attn)
        _copy_ffn(ours.ffn.sublayer, ref)
        ours.self_attn.norm.load_state_dict(ref.norm1.state_dict())
        ours.cross_attn.norm.load_state_dict(ref.norm2.state_dict())
        ours.ffn.norm.load_state_dict(ref.norm3.state_dict())
    x, memory = torch.randn(3, 6, D), torch.randn(3, 8, D)
    mem_pad = torch.zeros(3, 8, dtype=torch.bool)
    mem_pad[2, 4:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    expected = ref(x, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mem_pad)
    got = ours(x, AttentionInputs(is_causal=True), memory=memory, memory_mask=~mem_pad[:, None, None, :])
    assert (got - expected).abs().max().item() <= 1e-5


def test_llama_style_matches_hf_llama():
    transformers = pytest.importorskip("transformers")
    cfg = OmegaConf.load(REPO_ROOT / "configs" / "model" / "llama_style.yaml")
    base = tiny_model_config(
        arch="decoder_only",
        norm_position="pre",
        n_encoder_layers=0,
        n_decoder_layers=2,
        n_heads=4,
        attention__name="gqa",
        attention__n_kv_heads=2,
        bias=False,
        scale_embeddings=False,
        tie_embeddings="none",
        init="normal",
        d_ff=96,
    )
    base.norm.name, base.norm.eps = "rmsnorm", 1e-5
    base.ffn.name, base.position.name, base.position.rope_theta = "swiglu", "rope", 10000.0
    assert cfg.arch == base.arch and cfg.norm_position == base.norm_position and cfg.bias == base.bias
    vocab = 50
    ours = build_model(base, vocab).eval()
    hidden = ours.decoder.layers[0].ffn.sublayer.w2.in_features  # 2/3 * 96 = 64
    hf_cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=D,
        intermediate_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    ref = transformers.LlamaForCausalLM(hf_cfg).eval()
    sd = ref.state_dict()
    with torch.no_grad():
        ours.embed.embedding.weight.copy_(sd["model.embed_tokens.weight"])
        ours.output_proj.weight.copy_(sd["lm_head.weight"])
        ours.decoder.final_norm.weight.copy_(sd["model.norm.weight"])
        for i, layer in enumerate(ours.decoder.layers):
            p = f"model.layers.{i}."
            layer.self_attn.norm.weight.copy_(sd[p + "input_layernorm.weight"])
            layer.self_attn.sublayer.in_proj.weight.copy_(
                torch.cat(
                    [
                        sd[p + "self_attn.q_proj.weight"],
                        sd[p + "self_attn.k_proj.weight"],
                        sd[p + "self_attn.v_proj.weight"],
                    ]
                )
            )
            layer.self_attn.sublayer.out_proj.weight.copy_(sd[p + "self_attn.o_proj.weight"])
            layer.ffn.norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
            layer.ffn.sublayer.w13.weight.copy_(
                torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
            )
            layer.ffn.sublayer.w2.weight.copy_(sd[p + "mlp.down_proj.weight"])
    tokens = torch.randint(5, vocab, (2, 11))
    with torch.no_grad():
        expected = ref(tokens).logits
        got = ours(tokens)
    assert (got - expected).abs().max().item() <= 1e-5
