"""One entry point per direction: :func:`export_run` (a run -> HF / CTranslate2 folder),
:func:`import_hf_llama` (a HF decoder-only folder -> a run folder), and :func:`run_export`, the work
of ``scripts/export.py``. Everything is checked first, and the output is written into a temporary
folder renamed to ``out`` only when complete. docs/export.md."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer.data.tokenizer import Tokenizer
from transformer.generation import load_run
from transformer.interop import ct2, hf_llama, hf_marian, hf_moe, hf_moe_import
from transformer.interop.export_common import ExportError, plugin_options_unsupported, refuse, staging_dir
from transformer.plugins import import_plugins
from transformer.runs.folder import BEST
from transformer.training.checkpoint import save_checkpoint

__all__ = ["FORMATS", "export_run", "import_hf_llama", "run_export", "unsupported"]

FORMATS = ("hf", "ctranslate2")


def _require(package: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ExportError(f"this export needs the '{package}' package: pip install -e '.[{extra}]'")


def _model_type(folder: Path) -> str | None:
    """``model_type`` of a HF folder's ``config.json`` (None without one: the Llama importer names the problem)."""
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def unsupported(cfg: Any, fmt: str) -> tuple[str, list[str]]:
    """``(target name, reasons)``: why format ``fmt`` (``hf`` or ``ctranslate2``) cannot represent a model
    of ``cfg``. ``hf`` picks DeepSeek-V3 (MLA), Mixtral (MoE), Qwen3 (QK-norm), else Llama, and Marian
    for encoder-decoders.

    Raises:
        ExportError: unknown ``fmt``.
    """
    plugin = plugin_options_unsupported(cfg)
    if plugin:  # the exporters know the zoo's own options only: a plugin's is refused by name
        return ("Hugging Face" if fmt == "hf" else ct2.TARGET), plugin
    if fmt == "hf":
        if cfg.arch == "decoder_only" and hf_moe.moe_target(cfg) is not None:
            return hf_moe.moe_target(cfg), hf_moe.moe_unsupported(cfg)
        if cfg.arch == "decoder_only" and getattr(cfg, "qk_norm", "none") != "none":
            return hf_llama.QWEN3_TARGET, hf_llama.qwen3_unsupported(cfg)
        if cfg.arch == "decoder_only":
            return hf_llama.TARGET, hf_llama.llama_unsupported(cfg)
        return hf_marian.TARGET, hf_marian.marian_unsupported(cfg)
    if fmt == "ctranslate2":
        return ct2.TARGET, ct2.ct2_unsupported(cfg)
    raise ExportError(f"format={fmt!r} is not one of {', '.join(FORMATS)}")


def export_run(
    checkpoint: str | Path, fmt: str, out: str | Path, *, force: bool = False, quantization: str | None = None
) -> Path:
    """Export a trained run (folder, checkpoint file or stem) to a Hugging Face or CTranslate2 folder ``out``.

    ``quantization`` (CTranslate2 only): ``int8``, ``int8_float32``, ``int16``, ``float16``,
    ``bfloat16``, ``float32``; None keeps fp32.

    Raises:
        ExportError: a switch the target cannot represent (named), a missing optional package, an
            existing ``out`` without ``force``, or an invalid ``quantization``; nothing is written.
        LoadError: the checkpoint cannot be loaded.
    """
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt!r} is not one of {', '.join(FORMATS)}")
    if quantization is not None and fmt != "ctranslate2":
        raise ExportError(f"quantization={quantization} applies to format=ctranslate2 only")
    out = Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out} already exists: choose another out= or pass force=true to replace it")
    loaded = load_run(checkpoint, "cpu")
    model, toks, cfg = loaded
    target, why = unsupported(cfg.model, fmt)
    refuse(target, why)
    _require("transformers" if fmt == "hf" else "ctranslate2", "interop")
    if quantization is not None:
        from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

        if quantization not in ACCEPTED_MODEL_TYPES:
            raise ExportError(f"quantization={quantization} is not one of {', '.join(ACCEPTED_MODEL_TYPES)}")
    model.float()
    with staging_dir(out, force) as tmp:
        if fmt == "ctranslate2":
            ct2.save_ct2(model, cfg.model, toks, tmp, quantization)
        elif cfg.model.arch == "decoder_only" and hf_moe.moe_target(cfg.model) is not None:
            hf_moe.save_hf_moe(model, cfg.model, toks.src, tmp, cfg)
        elif cfg.model.arch == "decoder_only":
            hf_llama.save_hf_llama(model, cfg.model, toks.src, tmp, cfg)
        else:
            hf_marian.save_marian(model, cfg.model, toks, tmp, cfg)
    return out


def import_hf_llama(folder: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """Turn a HF ``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``MixtralForCausalLM`` or
    ``DeepseekV3ForCausalLM`` folder into a run folder our scripts load. Its ``tokenizer.model`` must
    have this project's special ids (our exports ship one).

    Raises:
        ExportError: a feature ours lacks (named), a missing or foreign tokenizer, a vocabulary size
            other than the tokenizer's, or an existing ``out`` without ``force``.
    """
    _require("transformers", "interop")
    folder, out = Path(folder), Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out} already exists: choose another out= or pass force=true to replace it")
    spm_file = folder / "tokenizer.model"
    if not spm_file.is_file():
        raise ExportError(f"{folder} has no tokenizer.model (the SentencePiece model the run folder needs)")
    try:
        tok = Tokenizer(spm_file)
    except ValueError as e:
        raise ExportError(f"{spm_file} is not a tokenizer of this project: {e}") from e
    importer = hf_moe_import.from_hf_moe if _model_type(folder) in hf_moe_import.MODEL_TYPES else hf_llama.from_hf_llama
    model, run_cfg = importer(folder)
    rows = model.embed.embedding.weight.shape[0]
    if rows != len(tok):
        raise ExportError(f"{folder}: vocab_size={rows} differs from the {len(tok)} pieces of {spm_file.name}")
    run_cfg.data.vocab_size = len(tok)
    run_cfg.data.joint_vocab = True
    with staging_dir(out, force) as tmp:
        shutil.copyfile(spm_file, tmp / "spm.model")
        OmegaConf.save(run_cfg, tmp / "config.yaml")
        save_checkpoint(
            tmp,
            BEST,
            model.state_dict(),
            {"config": OmegaConf.to_container(run_cfg), "update": 0, "imported_from": str(folder)},
        )
    return out


def run_export(cfg: Any) -> Path:
    """What ``scripts/export.py`` does: export ``cfg.run``, or with ``format=zoo`` import a HF folder
    (after importing ``cfg.plugins``); returns the folder written.

    Raises:
        ExportError: see :func:`export_run` and :func:`import_hf_llama`; ``quantization`` with
            ``format=zoo``. Nothing is written.
        LoadError: the checkpoint cannot be loaded.
        ConfigError: a run config beside the exported model that does not fit the schema.
        PluginError: a named plugin cannot be imported.
    """
    if cfg.format == "zoo":
        if cfg.quantization is not None:
            raise ExportError("quantization applies to format=ctranslate2 only")
        import_plugins(cfg.get("plugins") or [])  # the run's training-only plugin options are then kept and read
        out = import_hf_llama(cfg.run, cfg.out, force=bool(cfg.force))
    else:
        out = export_run(cfg.run, str(cfg.format), cfg.out, force=bool(cfg.force), quantization=cfg.quantization)
    print(f"wrote {out} (format={cfg.format})", file=sys.stderr)
    return out
