"""Decoder-only mixture-of-experts and latent-attention models -> Hugging Face ``MixtralForCausalLM``
(Jiang et al. 2024) and ``DeepseekV3ForCausalLM`` (DeepSeek-AI 2024); what maps and what is refused:
docs/export.md#mixtral-and-deepseek-v3-formathf-decoder-only.

Our stacked experts are HF's in-memory layout (``gate_up_proj``, gate rows first = ``w13``;
``down_proj`` = ``w2``); ``save_pretrained`` writes per-expert tensors, so the import
(:mod:`transformer.interop.hf_moe_import`) reads folders through ``from_pretrained``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from transformer.config import model_sizes
from transformer.interop.export_common import ExportError, attention_unsupported, is_latent, refuse, state_dict_fp32
from transformer.interop.hf_decoder import (
    HF_ACT,
    HF_ROPE_TYPES,
    decoder_unsupported,
    hf_config_fields,
    hf_model_holding,
    write_hf_folder,
)

__all__ = [
    "DEEPSEEK_TARGET",
    "LATENT_EPS",
    "MIXTRAL_TARGET",
    "deepseek_unsupported",
    "hf_moe_state",
    "layer_pairs",
    "mixtral_unsupported",
    "moe_target",
    "moe_unsupported",
    "save_hf_moe",
    "to_hf_moe",
]

MIXTRAL_TARGET = "Hugging Face MixtralForCausalLM"
DEEPSEEK_TARGET = "Hugging Face DeepseekV3ForCausalLM"
LATENT_EPS = 1e-6  # DeepseekV3RMSNorm's default, used by q_a_layernorm / kv_a_layernorm


def moe_target(cfg: Any) -> str | None:
    """The HF class a decoder-only config exports to through this module: DeepSeek-V3 for
    ``model/attention=mla``, Mixtral for ``model/ffn=moe`` with any other attention, else None."""
    if is_latent(cfg):
        return DEEPSEEK_TARGET
    return MIXTRAL_TARGET if cfg.ffn.name == "moe" else None


def _moe_refusals(cfg: Any, family: str) -> list[str]:
    """What both families refuse: biases and experts that are not gated."""
    why = []
    if cfg.bias:
        why.append(f"model.bias=true: {family}'s feed-forward blocks and experts have no biases")
    if cfg.ffn.name == "moe" and cfg.ffn.expert not in HF_ACT:
        why.append(f"model.ffn.expert={cfg.ffn.expert}: {family}'s experts are gated (swiglu or geglu)")
    return why


def mixtral_unsupported(cfg: Any) -> list[str]:
    """Why ``MixtralForCausalLM`` cannot hold a model of config ``cfg`` (a model config), one sentence
    per switch, each starting with the switch (empty when it can)."""
    why = (
        decoder_unsupported(cfg, "Mixtral")
        + attention_unsupported(cfg, "MixtralForCausalLM", rope_types=HF_ROPE_TYPES, sliding_window=True)
        + _moe_refusals(cfg, "Mixtral")
    )
    f = cfg.ffn
    if f.name != "moe":
        return why + [
            f"model/ffn={f.name}: MixtralForCausalLM's MLP is a mixture of experts (model/ffn=moe; "
            "dense models export as LlamaForCausalLM)"
        ]
    if f.router != "softmax":
        why.append(
            f"model.ffn.router={f.router}: Mixtral scores experts with softmax (DeepSeek-V3's sigmoid "
            "router exports as DeepseekV3ForCausalLM, with model/attention=mla)"
        )
    if not f.norm_topk_prob:
        why.append("model.ffn.norm_topk_prob=false: Mixtral always renormalises the top-k weights")
    if f.routed_scaling_factor != 1.0:
        why.append(
            f"model.ffn.routed_scaling_factor={f.routed_scaling_factor:g}: Mixtral does not scale the routed experts"
        )
    if f.n_shared_experts:
        why.append(f"model.ffn.n_shared_experts={f.n_shared_experts}: Mixtral has no shared experts")
    if f.bias_update_speed > 0:
        why.append(
            f"model.ffn.bias_update_speed={f.bias_update_speed:g}: Mixtral's router has no selection bias "
            "(e_score_correction_bias is DeepSeek-V3's)"
        )
    return why


def deepseek_unsupported(cfg: Any) -> list[str]:
    """Why ``DeepseekV3ForCausalLM`` cannot hold a model of config ``cfg`` (a model config), one sentence
    per switch, each starting with the switch (empty when it can)."""
    why = (
        decoder_unsupported(cfg, "DeepseekV3")
        + attention_unsupported(cfg, "DeepseekV3ForCausalLM", rope_types=HF_ROPE_TYPES, kinds=("mla",))
        + _moe_refusals(cfg, "DeepSeek-V3")
    )
    if is_latent(cfg) and cfg.norm.eps != LATENT_EPS:
        why.append(
            f"model.norm.eps={cfg.norm.eps:g} with model/attention=mla: DeepSeek-V3's latent RMSNorms have "
            "eps 1e-6, ours take model.norm.eps (set model.norm.eps=1e-6)"
        )
    f = cfg.ffn
    if f.name != "moe" and f.name not in HF_ACT:
        why.append(f"model/ffn={f.name}: DeepSeek-V3's MLP is gated (model/ffn=swiglu, geglu or moe)")
    if f.name == "moe" and f.router != "sigmoid":
        why.append(f"model.ffn.router={f.router}: DeepSeek-V3 scores experts with sigmoid (model.ffn.router=sigmoid)")
    if f.name == "moe" and f.n_experts < 2:
        why.append(f"model.ffn.n_experts={f.n_experts}: DeepSeek-V3's router needs at least 2 experts")
    return why


def moe_unsupported(cfg: Any) -> list[str]:
    """The reasons of :func:`moe_target`'s class (:func:`mixtral_unsupported` or :func:`deepseek_unsupported`)."""
    return deepseek_unsupported(cfg) if moe_target(cfg) == DEEPSEEK_TARGET else mixtral_unsupported(cfg)


def layer_pairs(cfg: Any) -> list[tuple[str, tuple[str, ...], tuple[int, ...] | None]]:
    """``(our name, HF names, rows)`` for one layer (names after ``decoder.layers.i.`` / ``model.layers.i.``):
    several HF tensors are our tensor cut into ``rows`` along dim 0 (in that order); None = one tensor."""
    sizes = model_sizes(cfg)
    attn, mlp = "self_attn.sublayer.", "ffn.sublayer."
    pairs: list[tuple[str, tuple[str, ...], tuple[int, ...] | None]] = [
        ("self_attn.norm.weight", ("input_layernorm.weight",), None),
        ("ffn.norm.weight", ("post_attention_layernorm.weight",), None),
    ]
    if sizes.latent is None:
        q, kv = sizes.n_heads * sizes.head_dim, sizes.kv_width
        pairs.append(
            (
                attn + "in_proj.weight",
                ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
                (q, kv, kv),
            )
        )
    elif sizes.latent.q_lora_rank is None:
        pairs.append((attn + "q_proj.weight", ("self_attn.q_proj.weight",), None))
    else:
        pairs += [
            (attn + f"q_proj.{i}.weight", (f"self_attn.{hf}.weight",), None)
            for i, hf in enumerate(("q_a_proj", "q_a_layernorm", "q_b_proj"))
        ]
    if sizes.latent is not None:
        pairs += [
            (attn + f"{ours}.weight", (f"self_attn.{hf}.weight",), None)
            for ours, hf in (("kv_down", "kv_a_proj_with_mqa"), ("kv_norm", "kv_a_layernorm"), ("kv_up", "kv_b_proj"))
        ]
    pairs.append((attn + "out_proj.weight", ("self_attn.o_proj.weight",), None))
    gate_up = ("gate_proj.weight", "up_proj.weight")
    if not sizes.n_experts:  # dense (DeepSeek-V3 with first_k_dense_replace = every layer)
        h = sizes.ffn_hidden
        return pairs + [
            (mlp + "w13.weight", tuple(f"mlp.{n}" for n in gate_up), (h, h)),
            (mlp + "w2.weight", ("mlp.down_proj.weight",), None),
        ]
    pairs += [
        (mlp + "router.gate.weight", ("mlp.gate.weight",), None),
        (mlp + "experts.w13", ("mlp.experts.gate_up_proj",), None),
        (mlp + "experts.w2", ("mlp.experts.down_proj",), None),
    ]
    if is_latent(cfg):  # DeepSeek-V3: the selection bias and the shared experts
        pairs.append((mlp + "router.expert_bias", ("mlp.gate.e_score_correction_bias",), None))
    if sizes.shared_hidden:
        h = sizes.shared_hidden
        pairs += [
            (mlp + "shared_experts.w13.weight", tuple(f"mlp.shared_experts.{n}" for n in gate_up), (h, h)),
            (mlp + "shared_experts.w2.weight", ("mlp.shared_experts.down_proj.weight",), None),
        ]
    return pairs


def hf_moe_state(model: nn.Module, cfg: Any) -> dict[str, Tensor]:
    """Our decoder-only state dict in the HF class's in-memory names (fp32, CPU; ``lm_head.weight`` even
    when tied; zero-width ``shared_experts`` for DeepSeek-V3 without shared experts)."""
    ours = state_dict_fp32(model)
    emb = ours["embed.embedding.weight"]
    if cfg.scale_embeddings:  # untied (refused otherwise): fold the scale in
        emb = emb * math.sqrt(cfg.d_model)
    new = {
        "model.embed_tokens.weight": emb,
        "model.norm.weight": ours["decoder.final_norm.weight"],
        "lm_head.weight": ours["output_proj.weight"],
    }
    sizes = model_sizes(cfg)
    for i in range(cfg.n_encoder_layers + cfg.n_decoder_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for name, hf_names, rows in layer_pairs(cfg):
            parts = ours[src + name].split(rows) if rows else (ours[src + name],)
            new.update({dst + hf: part for hf, part in zip(hf_names, parts)})
        if is_latent(cfg) and sizes.n_experts and not sizes.shared_hidden:
            d = cfg.d_model
            new.update(
                {
                    f"{dst}mlp.shared_experts.{n}_proj.weight": emb.new_zeros(shape)
                    for n, shape in (("gate", (0, d)), ("up", (0, d)), ("down", (d, 0)))
                }
            )
    return new


def _hf_config(cfg: Any, vocab_size: int, pad_id: int, eos_id: int) -> Any:
    """The ``MixtralConfig`` or ``DeepseekV3Config`` of a model config that passes :func:`moe_unsupported`."""
    from transformers import DeepseekV3Config, MixtralConfig

    sizes = model_sizes(cfg)
    f, n_layers = cfg.ffn, cfg.n_encoder_layers + cfg.n_decoder_layers
    act = HF_ACT[f.expert if f.name == "moe" else f.name]
    common = hf_config_fields(cfg, vocab_size, act, pad_id, eos_id)
    if moe_target(cfg) == MIXTRAL_TARGET:
        return MixtralConfig(
            **common,
            intermediate_size=sizes.ffn_hidden,
            num_key_value_heads=sizes.n_kv_heads,
            head_dim=sizes.head_dim,
            sliding_window=cfg.attention_window,
            num_local_experts=sizes.n_experts,
            num_experts_per_tok=sizes.top_k,
            router_aux_loss_coef=f.router_aux_loss_coef,
            router_jitter_noise=0.0,
            architectures=["MixtralForCausalLM"],
        )
    lat, moe = sizes.latent, bool(sizes.n_experts)
    return DeepseekV3Config(
        **common,
        intermediate_size=sizes.ffn_hidden,
        moe_intermediate_size=sizes.ffn_hidden,
        num_key_value_heads=cfg.n_heads,
        kv_lora_rank=lat.kv_lora_rank,
        q_lora_rank=lat.q_lora_rank,
        qk_rope_head_dim=lat.qk_rope_head_dim,
        qk_nope_head_dim=lat.qk_nope_head_dim,
        v_head_dim=lat.v_head_dim,
        rope_interleave=False,
        attention_bias=False,
        first_k_dense_replace=0 if moe else n_layers,
        n_routed_experts=sizes.n_experts if moe else 0,
        num_experts_per_tok=sizes.top_k if moe else 0,
        n_shared_experts=f.n_shared_experts if moe else 0,
        routed_scaling_factor=f.routed_scaling_factor if moe else 1.0,
        norm_topk_prob=bool(f.norm_topk_prob),
        n_group=1,
        topk_group=1,
        num_mtp_layers=0,
        architectures=["DeepseekV3ForCausalLM"],
    )


def to_hf_moe(model: nn.Module, cfg: Any) -> Any:
    """A ``MixtralForCausalLM`` or ``DeepseekV3ForCausalLM`` (:func:`moe_target`; fp32, eval mode, SDPA)
    whose logits equal ``model(tokens)``.

    Raises:
        ExportError: a switch the class cannot represent (named), or a Mixtral export of routers with
            a non-zero selection bias.
    """
    from transformers import DeepseekV3ForCausalLM, MixtralForCausalLM

    target = moe_target(cfg)
    if target is None:
        raise ExportError("neither Mixtral nor DeepSeek-V3: the model has no model/ffn=moe and no model/attention=mla")
    refuse(target, moe_unsupported(cfg))
    state = hf_moe_state(model, cfg)
    if target == MIXTRAL_TARGET:
        biased = [n for n, b in model.named_buffers() if n.endswith("router.expert_bias") and b.any()]
        refuse(target, [f"{biased[0]} is not zero: Mixtral's router has no selection bias"] if biased else [])
    hf_cfg = _hf_config(cfg, state["model.embed_tokens.weight"].shape[0], model.pad_id, model.eos_id)
    return hf_model_holding(
        MixtralForCausalLM if target == MIXTRAL_TARGET else DeepseekV3ForCausalLM, hf_cfg, state, target
    )


def save_hf_moe(model: nn.Module, cfg: Any, tokenizer: Any, folder: Path, run_cfg: Any = None) -> None:
    """Write a ``MixtralForCausalLM`` / ``DeepseekV3ForCausalLM`` folder as the Llama export does.

    Raises:
        ExportError: as :func:`to_hf_moe`.
    """
    write_hf_folder(to_hf_moe(model, cfg), model, tokenizer, folder, run_cfg)
