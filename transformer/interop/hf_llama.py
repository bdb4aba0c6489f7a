"""Decoder-only Llama-style models <-> Hugging Face ``LlamaForCausalLM`` (Touvron et al. 2023) and,
with ``model.qk_norm=rmsnorm``, ``Qwen3ForCausalLM`` (Qwen Team 2025);
docs/export.md#llama-and-qwen3-formathf-decoder-only.

The architectures match (half-split RoPE, fp32 RMSNorm, no embedding scale); only the packing
differs: our ``in_proj`` stacks HF's ``q_proj``/``k_proj``/``v_proj`` rows and our ``w13`` its
``gate_proj``/``up_proj``. An embedding scale is folded into an untied embedding matrix. RoPE
scaling maps to ``rope_parameters`` (static ``ntk`` has no HF counterpart and is refused)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer.config import resolve_n_kv_heads
from transformer.interop.export_common import ExportError, attention_unsupported, refuse, state_dict_fp32
from transformer.interop.hf_decoder import (
    HF_ACT,
    HF_ROPE_TYPES,
    decoder_unsupported,
    hf_config_fields,
    hf_model_holding,
    imported_fields,
    imported_model,
    imported_run_config,
    scaling_from_hf,
    write_hf_folder,
)

__all__ = [
    "QWEN3_TARGET",
    "from_hf_llama",
    "hf_llama_state",
    "llama_config",
    "llama_unsupported",
    "qwen3_unsupported",
    "save_hf_llama",
    "to_hf_llama",
    "zoo_state_from_llama",
]

TARGET = "Hugging Face LlamaForCausalLM"
QWEN3_TARGET = "Hugging Face Qwen3ForCausalLM"


def llama_unsupported(cfg: Any, target: str = TARGET) -> list[str]:
    """One sentence per switch of model config ``cfg`` that ``LlamaForCausalLM`` cannot hold (empty: it can)."""
    why = [] if target != TARGET else attention_unsupported(cfg, "LlamaForCausalLM", rope_types=HF_ROPE_TYPES)
    why += decoder_unsupported(cfg, "Llama")
    if cfg.ffn.name not in HF_ACT:
        why.append(f"model/ffn={cfg.ffn.name}: Llama's MLP is gated (model/ffn=swiglu or geglu)")
    return why


def qwen3_unsupported(cfg: Any) -> list[str]:
    """Llama's reasons plus QK-norm other than RMSNorm and MLP biases (empty: Qwen3 can hold it)."""
    why = llama_unsupported(cfg, QWEN3_TARGET) + attention_unsupported(
        cfg, "Qwen3ForCausalLM", qk_norm=("rmsnorm",), rope_types=HF_ROPE_TYPES
    )
    if cfg.bias:
        why.append("model.bias=true: Qwen3's MLP has no biases (attention_bias only)")
    return why


def llama_config(cfg: Any, vocab_size: int, ffn_hidden: int, *, pad_id: int = 0, eos_id: int = 3) -> Any:
    """The ``LlamaConfig`` of a model config (SDPA attention), or a ``Qwen3Config`` with QK-norm; no BOS,
    as our prefix LM starts with the first source piece."""
    from transformers import LlamaConfig, Qwen3Config

    kwargs = dict(
        hf_config_fields(cfg, vocab_size, HF_ACT[cfg.ffn.name], pad_id, eos_id),
        intermediate_size=ffn_hidden,
        num_key_value_heads=resolve_n_kv_heads(cfg),
        head_dim=cfg.d_model // cfg.n_heads,
        attention_bias=bool(cfg.bias),
    )
    if getattr(cfg, "qk_norm", "none") != "none":  # Qwen3: biases on q/k/v/o only, so model.bias=false there
        return Qwen3Config(**kwargs, use_sliding_window=False, architectures=["Qwen3ForCausalLM"])
    return LlamaConfig(**kwargs, mlp_bias=bool(cfg.bias), architectures=["LlamaForCausalLM"])


def hf_llama_state(model: nn.Module, cfg: Any) -> dict[str, Tensor]:
    """Our decoder-only state dict as ``LlamaForCausalLM``'s (fp32, CPU; ``lm_head.weight`` even when tied)."""
    ours = state_dict_fp32(model)
    q = cfg.n_heads * (cfg.d_model // cfg.n_heads)
    kv = resolve_n_kv_heads(cfg) * (cfg.d_model // cfg.n_heads)
    emb = ours["embed.embedding.weight"]
    if cfg.scale_embeddings:  # untied (llama_unsupported refuses the tied case): fold the scale in
        emb = emb * math.sqrt(cfg.d_model)
    new = {
        "model.embed_tokens.weight": emb,
        "model.norm.weight": ours["decoder.final_norm.weight"],
        "lm_head.weight": ours["output_proj.weight"],
    }
    for i in range(cfg.n_encoder_layers + cfg.n_decoder_layers):
        src, dst = f"decoder.layers.{i}", f"model.layers.{i}"
        hidden = ours[f"{src}.ffn.sublayer.w2.weight"].shape[1]
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            for name, part in zip(("q", "k", "v"), ours[f"{src}.self_attn.sublayer.in_proj.{kind}"].split((q, kv, kv))):
                new[f"{dst}.self_attn.{name}_proj.{kind}"] = part
            new[f"{dst}.self_attn.o_proj.{kind}"] = ours[f"{src}.self_attn.sublayer.out_proj.{kind}"]
            gate, up = ours[f"{src}.ffn.sublayer.w13.{kind}"].split((hidden, hidden))
            new[f"{dst}.mlp.gate_proj.{kind}"], new[f"{dst}.mlp.up_proj.{kind}"] = gate, up
            new[f"{dst}.mlp.down_proj.{kind}"] = ours[f"{src}.ffn.sublayer.w2.{kind}"]
        new[f"{dst}.input_layernorm.weight"] = ours[f"{src}.self_attn.norm.weight"]
        new[f"{dst}.post_attention_layernorm.weight"] = ours[f"{src}.ffn.norm.weight"]
        for name in ("q_norm", "k_norm"):  # QK-norm (Qwen3)
            if f"{src}.self_attn.sublayer.{name}.weight" in ours:
                new[f"{dst}.self_attn.{name}.weight"] = ours[f"{src}.self_attn.sublayer.{name}.weight"]
    return new


def zoo_state_from_llama(hf: dict[str, Tensor], n_layers: int, bias: bool) -> dict[str, Tensor]:
    """The inverse of :func:`hf_llama_state`; ``output_proj.weight`` is the embedding matrix when ``hf``
    has no ``lm_head.weight`` (tied)."""
    new = {
        "embed.embedding.weight": hf["model.embed_tokens.weight"],
        "decoder.final_norm.weight": hf["model.norm.weight"],
        "output_proj.weight": hf.get("lm_head.weight", hf["model.embed_tokens.weight"]),
    }
    for i in range(n_layers):
        src, dst = f"model.layers.{i}", f"decoder.layers.{i}"
        for kind in ("weight", "bias") if bias else ("weight",):
            new[f"{dst}.self_attn.sublayer.in_proj.{kind}"] = torch.cat(
                [hf[f"{src}.self_attn.{n}_proj.{kind}"] for n in ("q", "k", "v")]
            )
            new[f"{dst}.self_attn.sublayer.out_proj.{kind}"] = hf[f"{src}.self_attn.o_proj.{kind}"]
            new[f"{dst}.ffn.sublayer.w13.{kind}"] = torch.cat(
                [hf[f"{src}.mlp.gate_proj.{kind}"], hf[f"{src}.mlp.up_proj.{kind}"]]
            )
            new[f"{dst}.ffn.sublayer.w2.{kind}"] = hf[f"{src}.mlp.down_proj.{kind}"]
        new[f"{dst}.self_attn.norm.weight"] = hf[f"{src}.input_layernorm.weight"]
        new[f"{dst}.ffn.norm.weight"] = hf[f"{src}.post_attention_layernorm.weight"]
        for name in ("q_norm", "k_norm"):  # Qwen3's QK-norm
            if f"{src}.self_attn.{name}.weight" in hf:
                new[f"{dst}.self_attn.sublayer.{name}.weight"] = hf[f"{src}.self_attn.{name}.weight"]
    return new


def to_hf_llama(model: nn.Module, cfg: Any) -> Any:
    """A ``LlamaForCausalLM`` (or ``Qwen3ForCausalLM``), fp32 in eval mode, whose logits equal ``model``'s.

    Raises:
        ExportError: a switch Llama (or Qwen3) cannot represent (named).
    """
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM

    qwen3 = getattr(cfg, "qk_norm", "none") != "none"
    refuse(QWEN3_TARGET if qwen3 else TARGET, qwen3_unsupported(cfg) if qwen3 else llama_unsupported(cfg))
    state = hf_llama_state(model, cfg)
    hidden = state["model.layers.0.mlp.down_proj.weight"].shape[1]
    hf_cfg = llama_config(
        cfg, state["model.embed_tokens.weight"].shape[0], hidden, pad_id=model.pad_id, eos_id=model.eos_id
    )
    return hf_model_holding(Qwen3ForCausalLM if qwen3 else LlamaForCausalLM, hf_cfg, state, "Llama")


def save_hf_llama(model: nn.Module, cfg: Any, tokenizer: Any, folder: Path, run_cfg: Any = None) -> None:
    """Write a ``LlamaForCausalLM`` folder: config, safetensors, generation config, the SentencePiece
    model and ``run_cfg`` as ``transformer_zoo.yaml``.

    Raises:
        ExportError: as :func:`to_hf_llama`.
    """
    write_hf_folder(to_hf_llama(model, cfg), model, tokenizer, folder, run_cfg)


def from_hf_llama(folder: str | Path) -> tuple[nn.Module, Any]:
    """Import a ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` folder into our decoder-only model.

    Returns:
        ``(model, cfg)``: the model in eval mode (fp32), and the run config (``model`` from
        ``config.json``, the rest from ``transformer_zoo.yaml`` when present).

    Raises:
        ExportError: not such a folder, or a feature our model lacks (named): an unsupported RoPE
            scaling, a head width other than ``hidden_size / num_attention_heads``, biases on only some
            projections, an activation other than SiLU/GELU.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ExportError(f"{folder} is not a Hugging Face model folder (no config.json)")
    hc = AutoConfig.from_pretrained(folder)
    why = []
    if hc.model_type not in ("llama", "qwen3"):
        why.append(f"model_type={hc.model_type!r} is not llama or qwen3")
    if hc.model_type == "qwen3" and getattr(hc, "sliding_window", None) is not None:
        why.append(
            f"sliding_window={hc.sliding_window}: Qwen3's sliding layers are not imported (folders without use_sliding_window are)"
        )
    rope = dict(getattr(hc, "rope_parameters", None) or {})
    scaling, rope_why = scaling_from_hf(rope, hc.max_position_embeddings)
    why += rope_why
    head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
    if head_dim * hc.num_attention_heads != hc.hidden_size:
        why.append(
            f"head_dim={head_dim} x num_attention_heads={hc.num_attention_heads} != hidden_size={hc.hidden_size}"
        )
    if bool(hc.attention_bias) != bool(getattr(hc, "mlp_bias", False)):
        why.append("attention_bias != mlp_bias: model.bias sets both")
    act = {v: k for k, v in HF_ACT.items()}.get(hc.hidden_act)
    if act is None:
        why.append(f"hidden_act={hc.hidden_act!r}: model/ffn offers swiglu (silu) and geglu (gelu)")
    if why:
        raise ExportError(f"cannot import {folder} into the llama_style model: " + "; ".join(why))
    n_kv = hc.num_key_value_heads or hc.num_attention_heads
    attention = "mha" if n_kv == hc.num_attention_heads else ("mqa" if n_kv == 1 else "gqa")
    run_cfg = imported_run_config(
        folder,
        {
            **imported_fields(hc, float(rope.get("rope_theta", getattr(hc, "rope_theta", 10000.0))), scaling),
            "attention": {"name": attention, "n_kv_heads": None if attention == "mha" else n_kv},
            "bias": bool(hc.attention_bias),
            "qk_norm": "rmsnorm" if hc.model_type == "qwen3" else "none",
            "ffn": {"name": act, "glu_match_params": False},
        },
    )
    state: dict[str, Tensor] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder} holds no .safetensors weights")
    for f in files:
        state.update(load_file(f))
    ours = zoo_state_from_llama({k: v.float() for k, v in state.items()}, hc.num_hidden_layers, bool(hc.attention_bias))
    return imported_model(hc, run_cfg.model, ours, folder, "LlamaForCausalLM"), run_cfg
