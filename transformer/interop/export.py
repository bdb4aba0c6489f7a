"""One entry point per direction: :func:`export_run` (a run -> HF / CTranslate2 folder) and
:func:`import_hf_llama` (a HF ``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``MixtralForCausalLM`` or
``DeepseekV3ForCausalLM`` folder -> a run folder our scripts load);
:func:`run_export` is the work of ``scripts/export.py`` (config: ``configs/export.yaml``).

Both check everything first (the model's switches against the target, the optional packages, the
output folder) and write into a temporary folder that is renamed to ``out`` only when complete.
"""

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
from transformer.run_folder import BEST
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
    """``(target name, reasons)``: why format ``fmt`` cannot represent a model of config ``cfg``.

    Args:
        cfg: a model config.
        fmt: ``hf`` (for decoder-only models DeepSeek-V3 with ``model/attention=mla``, Mixtral with
            ``model/ffn=moe``, Qwen3 with ``model.qk_norm=rmsnorm``, else Llama; Marian for
            encoder-decoders) or ``ctranslate2``.

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
    """Export a trained run to a Hugging Face or CTranslate2 model folder.

    ``hf``: decoder-only Llama-style models become ``LlamaForCausalLM`` folders (``Qwen3ForCausalLM``
    with QK-norm, e.g. ``model=qwen3_style_tiny``; ``MixtralForCausalLM`` with ``model/ffn=moe``, e.g.
    ``model=mixtral_style_tiny``; ``DeepseekV3ForCausalLM`` with ``model/attention=mla``, e.g.
    ``model=deepseek_style_tiny``), 2017-style
    encoder-decoders ``MarianMTModel`` folders (with their tokenizer files). ``ctranslate2``: a
    CTranslate2 model folder with the vocabulary and SentencePiece model(s).

    Args:
        checkpoint: a run folder, checkpoint file or stem (as ``scripts/translate.py`` takes).
        fmt: ``hf`` or ``ctranslate2``.
        out: the folder to create.
        force: replace an existing ``out``.
        quantization: CTranslate2 only: weight type (``int8``, ``int8_float32``, ``int16``,
            ``float16``, ``bfloat16``, ``float32``); None keeps fp32.

    Returns:
        ``out``.

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
    """Turn a HF ``LlamaForCausalLM`` (or ``Qwen3ForCausalLM``, ``MixtralForCausalLM``,
    ``DeepseekV3ForCausalLM``: by ``config.json``'s ``model_type``) folder into a run folder
    (``config.yaml``, ``spm.model``, ``checkpoint_best``) that ``scripts/translate.py`` /
    ``evaluate.py`` / ``train.py`` load.

    The folder's ``tokenizer.model`` must be a SentencePiece model with this project's special ids
    (as our Llama exports ship): the imported model is our prefix LM (``source <sep> target``).

    Args:
        folder: the HF folder.
        out: the run folder to create.
        force: replace an existing ``out``.

    Returns:
        ``out``.

    Raises:
        ExportError: a feature of the HF model that ours lacks (named), a missing or foreign
            tokenizer, a vocabulary size that differs from the tokenizer's, or an existing ``out``.
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
    """What ``scripts/export.py`` does: export ``cfg.run`` (:func:`export_run`), or with
    ``format=zoo`` import a HF folder (:func:`import_hf_llama`); then ``wrote <out> (format=...)``
    on stderr.

    Args:
        cfg: ``configs/export.yaml`` as composed (a DictConfig, or anything with its fields):
            ``run``, ``format`` (``hf``, ``ctranslate2`` or ``zoo``), ``out``, ``force``,
            ``quantization``.

    Returns:
        The folder written.

    With ``format=zoo`` the plugins ``cfg.plugins`` names are imported first: the exported run's
    training-only options of theirs (``lr_scheduler``) are then kept with their fields, those of
    plugins not named are dropped with a note (:func:`~transformer.interop.export_common.readable_run_config`).

    Raises:
        ExportError: see :func:`export_run` and :func:`import_hf_llama`; also ``quantization``
            with ``format=zoo``. Nothing is written.
        LoadError: the checkpoint cannot be loaded.
        ConfigError: a run config beside the exported model that does not fit the schema.
        PluginError: a plugin named that cannot be imported.
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
