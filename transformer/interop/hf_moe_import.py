"""Hugging Face ``MixtralForCausalLM`` and ``DeepseekV3ForCausalLM`` folders -> our decoder-only models
(:func:`from_hf_moe`): the HF config read into our ``model`` fields (refusing, with a sentence each,
what our model lacks), the weights mapped back through :func:`~transformer.interop.hf_moe.layer_pairs`
(the export's mapping, :mod:`transformer.interop.hf_moe`), and a ``rope_interleave=true`` folder's
rotated query/key rows permuted into our half-split layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer.interop.export_common import ExportError
from transformer.interop.hf_decoder import HF_ACT, imported_fields, imported_model, imported_run_config, scaling_from_hf
from transformer.interop.hf_moe import LATENT_EPS, layer_pairs

__all__ = ["MODEL_TYPES", "from_hf_moe"]

MODEL_TYPES = ("mixtral", "deepseek_v3")  # config.json model_type values from_hf_moe reads


def _model_fields(hc: Any) -> tuple[dict[str, Any], list[str]]:
    """Our ``model`` fields of a Mixtral / DeepSeek-V3 HF config, and why it cannot be imported."""
    rope = dict(getattr(hc, "rope_parameters", None) or {})
    scaling, why = scaling_from_hf(rope, hc.max_position_embeddings)
    heads, n_layers = hc.num_attention_heads, hc.num_hidden_layers
    act = {v: k for k, v in HF_ACT.items()}.get(hc.hidden_act)
    if act is None:
        why.append(f"hidden_act={hc.hidden_act!r}: model/ffn offers swiglu (silu) and geglu (gelu)")
    if hc.hidden_size % heads:
        why.append(f"hidden_size={hc.hidden_size} is not divisible by num_attention_heads={heads}")
    fields = {**imported_fields(hc, float(rope.get("rope_theta", 10000.0)), scaling), "bias": False}
    moe = {"name": "moe", "expert": act, "glu_match_params": False, "top_k": hc.num_experts_per_tok}
    if hc.model_type == "mixtral":
        head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // heads
        if head_dim * heads != hc.hidden_size:
            why.append(f"head_dim={head_dim} x num_attention_heads={heads} != hidden_size={hc.hidden_size}")
        if hc.router_jitter_noise:
            why.append(f"router_jitter_noise={hc.router_jitter_noise}: model/ffn=moe has no router jitter")
        n_kv = hc.num_key_value_heads or heads
        attention = "mha" if n_kv == heads else ("mqa" if n_kv == 1 else "gqa")
        fields.update(
            attention={"name": attention, "n_kv_heads": None if attention == "mha" else n_kv},
            attention_window=hc.sliding_window,
            ffn={
                **moe,
                "n_experts": hc.num_local_experts,
                "expert_d_ff": hc.intermediate_size,
                "router": "softmax",
                "norm_topk_prob": True,
                "router_aux_loss_coef": float(hc.router_aux_loss_coef),
            },
        )
        return fields, why
    dense = hc.first_k_dense_replace or 0
    if hc.num_key_value_heads not in (None, heads):
        why.append(
            f"num_key_value_heads={hc.num_key_value_heads}: MLA expands keys and values for all "
            f"{heads} heads (num_key_value_heads = num_attention_heads)"
        )
    if 0 < dense < n_layers:
        why.append(f"first_k_dense_replace={dense} of {n_layers} layers: our layers are all dense or all MoE")
    if dense < n_layers and (hc.n_group or 1) != (hc.topk_group or 1):
        why.append(
            f"n_group={hc.n_group}, topk_group={hc.topk_group}: model/ffn=moe routes among all experts "
            "(no group-limited routing)"
        )
    if hc.attention_bias:
        why.append("attention_bias=true: model.bias would also give the feed-forward blocks biases")
    if hc.rms_norm_eps != LATENT_EPS:
        why.append(
            f"rms_norm_eps={hc.rms_norm_eps:g}: our MLA's latent RMSNorms share model.norm.eps, "
            "DeepSeek-V3's are fixed at 1e-6"
        )
    if rope.get("mscale_all_dim"):
        why.append(
            f"rope_parameters mscale_all_dim={rope['mscale_all_dim']}: DeepSeek-V3 scales its attention "
            "softmax by it, which model.position.rope_scaling cannot express"
        )
    fields.update(
        attention={
            "name": "mla",
            "n_kv_heads": None,
            "kv_lora_rank": hc.kv_lora_rank,
            "q_lora_rank": hc.q_lora_rank,
            "qk_nope_head_dim": hc.qk_nope_head_dim,
            "qk_rope_head_dim": hc.qk_rope_head_dim,
            "v_head_dim": hc.v_head_dim,
        }
    )
    fields["ffn"] = (
        {"name": act, "glu_match_params": False}
        if dense >= n_layers
        else {
            **moe,
            "n_experts": hc.n_routed_experts,
            "n_shared_experts": hc.n_shared_experts,
            "expert_d_ff": hc.moe_intermediate_size,
            "router": "sigmoid",
            "norm_topk_prob": bool(hc.norm_topk_prob),
            "routed_scaling_factor": float(hc.routed_scaling_factor),
        }
    )
    return fields, why


def _half_split(weight: Tensor, heads: int, start: int, width: int, rope: int) -> Tensor:
    """``weight`` with the ``rope`` rotated rows at ``start`` of each of ``heads`` blocks of ``width``
    rows moved from DeepSeek's interleaved pairs ``(x0, x1), (x2, x3), ...`` to our half-split layout."""
    perm = torch.cat((torch.arange(0, rope, 2), torch.arange(1, rope, 2)))
    w = weight.reshape(heads, width, -1).clone()
    w[:, start : start + rope] = w[:, start : start + rope][:, perm]
    return w.reshape(weight.shape)


def from_hf_moe(folder: str | Path) -> tuple[nn.Module, Any]:
    """Import a ``MixtralForCausalLM`` or ``DeepseekV3ForCausalLM`` folder into our decoder-only model.

    Args:
        folder: a Hugging Face model folder of ``model_type`` mixtral or deepseek_v3 (weights in
            either HF layout: it is read with ``from_pretrained``).

    Returns:
        ``(model, cfg)``: our model in eval mode (fp32) with the folder's weights, and the whole run
        config (the ``model`` section from ``config.json``, the rest from ``transformer_zoo.yaml`` when
        the folder has one; dropout and the training-only router settings start at 0 / their defaults).

    Raises:
        ExportError: a feature our model lacks, named (router jitter, dense first layers of a MoE
            model, group-limited routing, attention biases, a latent-norm eps other than 1e-6, YaRN's
            ``mscale_all_dim``, ...).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    hc = AutoConfig.from_pretrained(folder)
    if hc.model_type not in MODEL_TYPES:
        raise ExportError(f"cannot import {folder}: model_type={hc.model_type!r} is not {' or '.join(MODEL_TYPES)}")
    fields, why = _model_fields(hc)
    if why:
        raise ExportError(f"cannot import {folder} ({hc.model_type}): " + "; ".join(why))
    run_cfg = imported_run_config(folder, fields)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    state = {k: v.detach().float() for k, v in hf.state_dict().items()}
    if getattr(hc, "rope_interleave", False):
        nope, rope, lat = hc.qk_nope_head_dim, hc.qk_rope_head_dim, run_cfg.model.attention.kv_lora_rank
        q = "q_proj" if hc.q_lora_rank is None else "q_b_proj"
        for i in range(hc.num_hidden_layers):
            q_key, kv_key = (f"model.layers.{i}.self_attn.{n}.weight" for n in (q, "kv_a_proj_with_mqa"))
            state[q_key] = _half_split(state[q_key], hc.num_attention_heads, nope, nope + rope, rope)
            state[kv_key] = _half_split(state[kv_key], 1, lat, lat + rope, rope)
    emb = state["model.embed_tokens.weight"]
    ours = {
        "embed.embedding.weight": emb,
        "decoder.final_norm.weight": state["model.norm.weight"],
        "output_proj.weight": state.get("lm_head.weight", emb),
    }
    for i in range(hc.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for name, hf_names, _ in layer_pairs(run_cfg.model):
            ours[dst + name] = torch.cat([state[src + n] for n in hf_names])
    # Mixtral has no selection bias: ours stays zero
    return imported_model(hc, run_cfg.model, ours, folder, hc.model_type, optional=("router.expert_bias",)), run_cfg
