"""What the Hugging Face decoder-only exporters share (``hf_llama`` for Llama / Qwen3, ``hf_moe`` for
Mixtral / DeepSeek-V3): the checks every pre-norm RoPE decoder has in common, RoPE parameters in
both directions, the exported folder's tokenizer files and the run config of an imported folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch import Tensor, nn

from transformer.config import ConfigError, rope_scaling, typed_config
from transformer.interop.export_common import ExportError, readable_run_config
from transformer.models import build_model

__all__ = [
    "HF_ACT",
    "HF_ROPE_TYPES",
    "ZOO_CONFIG",
    "decoder_unsupported",
    "hf_config_fields",
    "hf_max_positions",
    "hf_model_holding",
    "imported_fields",
    "imported_model",
    "imported_run_config",
    "rope_parameters",
    "scaling_from_hf",
    "write_hf_folder",
]

HF_ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")  # rope_parameters types both sides compute alike
ZOO_CONFIG = "transformer_zoo.yaml"  # our full run config, kept beside config.json for the way back
HF_ACT = {"swiglu": "silu", "geglu": "gelu"}  # gated blocks -> HF hidden_act


def decoder_unsupported(cfg: Any, family: str) -> list[str]:
    """One sentence per reason a pre-norm RMSNorm RoPE decoder family (``family``: ``Llama``, ...)
    cannot hold a model of ``cfg``: architecture, norm position, norm, positions, an unfoldable
    embedding scale."""
    why = []
    if cfg.arch != "decoder_only":
        why.append(
            f"model.arch={cfg.arch}: {family}ForCausalLM is decoder-only (format=hf exports "
            "encoder-decoders as MarianMTModel)"
        )
    if cfg.norm_position != "pre":
        why.append(f"model.norm_position={cfg.norm_position}: {family} normalises before each sublayer (pre)")
    if cfg.norm.name != "rmsnorm":
        why.append(f"model/norm={cfg.norm.name}: {family} uses RMSNorm")
    if cfg.position.name != "rope":
        why.append(f"model/position={cfg.position.name}: {family} encodes positions with RoPE only")
    if cfg.scale_embeddings and cfg.tie_embeddings != "none":
        why.append(
            f"model.scale_embeddings=true with model.tie_embeddings={cfg.tie_embeddings}: {family} does "
            "not scale its embeddings, and a scale cannot be folded into a matrix shared with the output layer"
        )
    return why


def rope_parameters(cfg: Any) -> dict[str, Any]:
    """HF ``rope_parameters`` of our ``model.position`` (rope_theta and the scaling's fields)."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.position.rope_theta)}
    s = rope_scaling(cfg)
    if s is None:
        return params
    params.update(rope_type=s.rope_type, factor=s.factor)
    if s.rope_type in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = s.original_max_position_embeddings
    if s.rope_type == "yarn":
        params.update(beta_fast=s.beta_fast, beta_slow=s.beta_slow)
        if s.attention_factor is not None:
            params["attention_factor"] = s.attention_factor
    if s.rope_type == "llama3":
        params.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor)
    return params


def hf_config_fields(cfg: Any, vocab_size: int, hidden_act: str, pad_id: int, eos_id: int) -> dict[str, Any]:
    """The HF config fields every decoder family exports alike: sizes, activation, positions, norm,
    tying, special ids (no BOS) and init."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_encoder_layers + cfg.n_decoder_layers,
        num_attention_heads=cfg.n_heads,
        hidden_act=hidden_act,
        max_position_embeddings=hf_max_positions(cfg),
        rms_norm_eps=cfg.norm.eps,
        rope_parameters=rope_parameters(cfg),
        tie_word_embeddings=cfg.tie_embeddings != "none",
        pad_token_id=pad_id,
        bos_token_id=None,
        eos_token_id=eos_id,
        attention_dropout=0.0,
        initializer_range=cfg.init_std,
    )


def imported_fields(hc: Any, rope_theta: float, scaling: dict[str, Any]) -> dict[str, Any]:
    """Our ``model`` fields every decoder family reads alike from its HF config ``hc``; the caller adds
    attention, feed-forward block, biases and its own."""
    return {
        "arch": "decoder_only",
        "norm_position": "pre",
        "n_encoder_layers": 0,
        "n_decoder_layers": hc.num_hidden_layers,
        "d_model": hc.hidden_size,
        "n_heads": hc.num_attention_heads,
        "d_ff": hc.intermediate_size,
        "dropout": 0.0,
        "attention_dropout": float(hc.attention_dropout or 0.0),
        "activation_dropout": 0.0,
        "scale_embeddings": False,
        "tie_embeddings": "all" if hc.tie_word_embeddings else "none",
        "max_positions": hc.max_position_embeddings,
        "init": "normal",
        "init_std": hc.initializer_range,
        "norm": {"name": "rmsnorm", "eps": hc.rms_norm_eps},
        "position": {"name": "rope", "rope_theta": rope_theta, "rope_scaling": scaling},
    }


def hf_max_positions(cfg: Any) -> int:
    """HF ``max_position_embeddings`` of our model config: ``model.max_positions``, or under dynamic NTK
    scaling its original length (HF's dynamic scaling starts past ``max_position_embeddings``)."""
    s = rope_scaling(cfg)
    return s.original_max_position_embeddings if s is not None and s.rope_type == "dynamic" else cfg.max_positions


def scaling_from_hf(rope: dict[str, Any], max_position_embeddings: int) -> tuple[dict[str, Any], list[str]]:
    """``(fields, reasons)``: ``model.position.rope_scaling`` of HF ``rope_parameters``, and one
    sentence per HF field we lack (the fields then empty)."""
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        return {"rope_type": "default"}, []
    if rope_type not in HF_ROPE_TYPES:
        return {}, [
            f"rope_parameters.rope_type={rope_type!r}: model.position.rope_scaling has "
            f"{', '.join(('default',) + HF_ROPE_TYPES)}"
        ]
    extra = [
        k
        for k in ("mscale", "mscale_all_dim", "long_factor", "short_factor", "partial_rotary_factor")
        if rope.get(k) not in (None, 0, 1.0)
    ]
    if rope.get("mscale") and rope.get("mscale_all_dim") and not extra:  # HF's YaRN then takes their ratio
        extra.append("mscale with mscale_all_dim")
    if rope_type == "yarn" and rope.get("truncate", True) is False:
        extra.append("truncate")
    if extra:
        return {}, [f"rope_parameters {', '.join(extra)}: model.position.rope_scaling has no such field"]
    scaling: dict[str, Any] = {"rope_type": rope_type, "factor": float(rope["factor"])}
    if rope_type == "dynamic":  # HF's dynamic NTK scales past max_position_embeddings
        scaling["original_max_position_embeddings"] = int(max_position_embeddings)
    if rope.get("original_max_position_embeddings") is not None and rope_type != "dynamic":
        scaling["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
    for key in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
        if rope.get(key) is not None:
            scaling[key] = float(rope[key])
    return scaling, []


def hf_model_holding(hf_class: Any, hf_cfg: Any, state: dict[str, Tensor], mapping: str) -> Any:
    """``hf_class(hf_cfg)`` in eval mode with SDPA attention, holding ``state`` (``lm_head.weight``
    popped under ``tie_word_embeddings``).

    Raises:
        ExportError: a weight of either side left unmatched (the first five named).
    """
    hf_cfg._attn_implementation = "sdpa"
    hf = hf_class(hf_cfg).eval()
    if hf_cfg.tie_word_embeddings:
        state.pop("lm_head.weight")
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (hf_cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ExportError(
            f"the {mapping} mapping left weights unmatched: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return hf


def write_hf_folder(hf: Any, model: nn.Module, tokenizer: Any, folder: Path, run_cfg: Any = None) -> None:
    """Write a HF causal-LM folder: config.json, model.safetensors, generation_config.json, the
    SentencePiece model (``tokenizer.model``) and ``run_cfg`` as ``transformer_zoo.yaml``."""
    hf.generation_config.update(
        eos_token_id=model.eos_id,
        pad_token_id=model.pad_id,
        bos_token_id=None,
        bad_words_ids=[[model.pad_id]],
        forced_eos_token_id=model.eos_id,
    )
    hf.save_pretrained(folder, safe_serialization=True)
    shutil.copyfile(tokenizer.model_path, folder / "tokenizer.model")
    specials = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "additional_special_tokens": ["<sep>"],
    }
    tokenizer_config = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False, "add_eos_token": False, **specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    if run_cfg is not None:
        OmegaConf.save(run_cfg, folder / ZOO_CONFIG)


def imported_model(
    hc: Any, model_cfg: Any, state: dict[str, Tensor], folder: Path, layout: str, optional: tuple[str, ...] = ()
) -> nn.Module:
    """Our model of ``model_cfg`` holding an imported folder's weights, in eval mode; ``optional``
    parameter suffixes may be missing (they keep their initial value).

    Raises:
        ExportError: weights missing or left over (the first five named).
    """
    eos = hc.eos_token_id[0] if isinstance(hc.eos_token_id, (list, tuple)) else hc.eos_token_id
    model = build_model(
        model_cfg,
        hc.vocab_size,
        pad_id=hc.pad_token_id if hc.pad_token_id is not None else 0,
        eos_id=3 if eos is None else eos,
    )
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(optional)]
    if missing or unexpected:
        raise ExportError(
            f"{folder}: weights do not fit {layout}'s layout: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return model.eval()


def imported_run_config(folder: Path, model_fields: dict[str, Any]) -> Any:
    """The run config of an imported HF folder: its ``transformer_zoo.yaml`` (else the defaults) with
    ``model`` replaced by ``model_fields`` (``config.json`` rules the architecture).

    Raises:
        ConfigError: ``transformer_zoo.yaml`` does not fit the schema (named).
    """
    zoo = folder / ZOO_CONFIG
    saved = readable_run_config(OmegaConf.to_container(OmegaConf.load(zoo), resolve=False)) if zoo.is_file() else None
    try:
        run_cfg = OmegaConf.to_container(typed_config(saved), resolve=False)
    except ConfigError as err:
        raise ConfigError(f"{zoo}: {err}") from None
    run_cfg["model"] = model_fields
    return typed_config(run_cfg)
