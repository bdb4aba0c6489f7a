"""Load a trained run (its folder, or one checkpoint in it) into a model, its tokenizers and config.

A folder means the weights its ``results.json`` was tested with (docs/decoding.md#which-weights-checkpointrun-loads).
Every failure is a sentence saying what is wrong: a missing checkpoint, a foreign file, weights that
do not fit the run's config, a ``checkpoint_id`` that differs from the ``.json`` metadata, or a
tokenizer that does not match the embeddings. An averaged file outside its run names that run in
its metadata (``source_run``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from transformer.config import (
    Config,
    ConfigError,
    GenerationConfig,
    config_differences,
    to_config,
    typed_config,
    upgrade_config,
    validate_generation_config,
)
from transformer.data.tokenizer import Tokenizer
from transformer.device import resolve_device
from transformer.generation.overrides import test_time_refusal
from transformer.models import build_model
from transformer.plugins import PluginError, import_recorded, untrusted
from transformer.runs.folder import CONFIG_NAMES, META_SUFFIX, STATE_SUFFIX, checkpoint_file, checkpoint_stem
from transformer.runs.weights import LoadError, find_checkpoint, read_weights

__all__ = ["LoadError", "LoadedRun", "Tokenizers", "find_checkpoint", "load_run", "merge_generation", "resolve_device"]


class Tokenizers(NamedTuple):
    """Source and target tokenizers (the same object for a joint vocabulary)."""

    src: Any
    tgt: Any


@dataclass
class LoadedRun:
    """A loaded model with everything needed to translate with it; unpacks as ``model, tokenizers, cfg``.

    Attributes:
        model: in eval mode on the requested device.
        tokenizers: :class:`Tokenizers` ``(src, tgt)``.
        cfg: the run's typed :class:`~transformer.config.Config`.
        run_dir: the folder of the config and tokenizers (an averaged file's source run).
        checkpoint: the ``.safetensors`` file loaded.
    """

    model: nn.Module
    tokenizers: Tokenizers
    cfg: Config
    run_dir: Path
    checkpoint: Path

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.tokenizers, self.cfg))


def _read_config(run_dir: Path, weights: Path) -> DictConfig:
    """The run's config: config.yaml in the run folder, else the training state's "config"."""
    for name in CONFIG_NAMES:
        f = run_dir / name
        if f.is_file():
            raw = OmegaConf.load(f)
            break
    else:
        state_file = checkpoint_file(checkpoint_stem(weights), STATE_SUFFIX)
        raw = None
        if state_file.is_file():
            try:
                payload = torch.load(state_file, map_location="cpu", weights_only=True)
            except Exception as e:  # a foreign or damaged file
                raise LoadError(f"cannot read the training state {state_file}: {e}") from e
            train_state = payload.get("train_state", payload) if isinstance(payload, dict) else None
            if isinstance(train_state, dict) and isinstance(train_state.get("config"), dict):
                raw = OmegaConf.create(train_state["config"])
        if raw is None:
            raise LoadError(
                f"no config for {weights}: expected {run_dir / 'config.yaml'} (written by "
                f"scripts/train.py) or a training state {state_file.name} with a 'config' entry"
            )
    untrusted(raw)  # a run's recorded plugins_trust is never read: trust is each command's own switch
    try:
        import_recorded(run_dir, raw)  # the run's plugins: from where they were, or a trusted copy, never silently
    except PluginError as e:
        raise LoadError(str(e)) from None
    try:
        return typed_config(raw)
    except ConfigError as e:
        raise LoadError(f"the config of {run_dir} {e}") from e


def _config_folder(run_dir: Path, weights: Path, meta: dict[str, str]) -> Path:
    """The folder with the run's config and tokenizers: the checkpoint's own folder, or for an
    averaged file written elsewhere the ``source_run`` recorded in its metadata."""
    if any((run_dir / name).is_file() for name in CONFIG_NAMES) or "source_run" not in meta:
        return run_dir
    source = Path(meta["source_run"])
    if not any((source / name).is_file() for name in CONFIG_NAMES):
        raise LoadError(
            f"{weights} was averaged from the run {source}, which holds no config.yaml any more (moved or "
            f"deleted?); put the file into its run folder, or copy that run's config.yaml and spm model(s) next to it"
        )
    return source


def _check_same_save(weights: Path, meta: dict[str, str]) -> None:
    """The weights' ``checkpoint_id`` must be the one of the ``.json`` metadata beside them."""
    info_file = checkpoint_file(checkpoint_stem(weights), META_SUFFIX)
    if not info_file.is_file() or not ({"checkpoint_id", "averaged_from"} & meta.keys()):
        return  # foreign files are named as such by the checks of load_run
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # not our metadata file; nothing to compare with
    expected = info.get("checkpoint_id") if isinstance(info, dict) else None
    if expected and meta.get("checkpoint_id") != expected:
        found = meta.get("checkpoint_id") or "none"
        raise LoadError(
            f"{weights.name} does not belong to {info_file.name} (checkpoint_id {found} vs {expected}): the "
            "weights were replaced or copied from another save or run; use the three files of one checkpoint "
            "together, each run's checkpoints with that run's config.yaml"
        )


def _check_model_config(weights: Path, meta: dict[str, str], cfg: DictConfig, config_dir: Path) -> None:
    """The model config recorded in the weights (newer checkpoints) must be the run's."""
    if "model_config" not in meta:
        return
    try:
        recorded = json.loads(meta["model_config"])
    except ValueError:
        return
    recorded = upgrade_config(recorded)  # weights saved before the model/attention group had its node
    current = OmegaConf.to_container(cfg.model, resolve=True)
    diffs = [
        f"model.{k}: {v} in the weights vs {u} in the config"
        for k, v, u in config_differences(recorded, current, common_only=True)
    ]
    if diffs:
        raise LoadError(
            f"{weights} was trained with another model config than {config_dir / 'config.yaml'} "
            f"({'; '.join(diffs[:5])}): use it with the config of the run that wrote it"
        )


def _load_tokenizers(run_dir: Path, cfg: Config, src: str | Path | None, tgt: str | Path | None) -> Tokenizers:
    def load(p: Path) -> Any:
        if not p.is_file():
            raise LoadError(f"tokenizer not found: {p}")
        try:
            return Tokenizer(p)
        except Exception as e:
            raise LoadError(f"{p} is not a usable SentencePiece model for this project: {e}") from e

    if src is not None or tgt is not None:
        s = load(Path(src or tgt))
        t = s if tgt is None or Path(tgt) == Path(src or tgt) else load(Path(tgt))
        return Tokenizers(s, t)
    if (run_dir / "spm.model").is_file():
        tok = load(run_dir / "spm.model")
        return Tokenizers(tok, tok)
    if (run_dir / "spm.src.model").is_file() or (run_dir / "spm.tgt.model").is_file():
        return Tokenizers(load(run_dir / "spm.src.model"), load(run_dir / "spm.tgt.model"))
    raise LoadError(
        f"no tokenizer in {run_dir}: expected spm.model (joint vocabulary) or spm.src.model + "
        "spm.tgt.model, or pass the SentencePiece model(s) explicitly"
    )


def _vocab_params(model: nn.Module) -> dict[str, str]:
    """State-dict names of the vocabulary-sized matrices -> "source" / "target"."""
    names = {}
    for mod_name, side in (("src_embed", "source"), ("embed", "source"), ("tgt_embed", "target")):
        if hasattr(model, mod_name):
            names[f"{mod_name}.embedding.weight"] = side
    names["output_proj.weight"] = "target"
    return names


def load_run(
    path: str | Path,
    device: str | torch.device = "cpu",
    *,
    src_tokenizer: str | Path | None = None,
    tgt_tokenizer: str | Path | None = None,
    overrides: list[str] | None = None,
) -> LoadedRun:
    """Load a trained model (eval mode), its tokenizers and its config as a :class:`LoadedRun`.

    Args:
        path: run folder, checkpoint file (``.safetensors`` / ``.pt``) or checkpoint stem.
        device: :func:`~transformer.device.resolve_device`'s (``auto``, ``cuda``, ...).
        src_tokenizer, tgt_tokenizer: SentencePiece models instead of the run's (one alone: both sides).
        overrides: dotlist overrides of the run's config (e.g. a test-time RoPE scaling), applied after
            the weights are checked against the run's own model config.

    Raises:
        LoadError: a missing checkpoint/config/tokenizer, a foreign file, weights that do not fit the
            config, a tokenizer of another vocabulary size, or a test-time RoPE scaling without RoPE.
    """
    run_dir, weights = find_checkpoint(path)
    state, meta = read_weights(weights)
    _check_same_save(weights, meta)
    run_dir = _config_folder(run_dir, weights, meta)
    cfg = _read_config(run_dir, weights)
    _check_model_config(weights, meta, cfg, run_dir)
    trained_scaling = OmegaConf.select(cfg, "model.position.rope_scaling", default=None)
    try:
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        cfg = to_config(cfg)
    except Exception as e:  # omegaconf's merge errors and ConfigError name the key
        raise LoadError(f"the config of {run_dir} with the overrides {list(overrides or [])} is invalid: {e}") from e
    refused = test_time_refusal(list(overrides or []), trained_scaling, cfg, run_dir)
    if refused:
        raise LoadError(refused)
    toks = _load_tokenizers(run_dir, cfg, src_tokenizer, tgt_tokenizer)
    joint = toks.src is toks.tgt
    arch = cfg.model.arch
    try:
        model = build_model(
            cfg.model,
            len(toks.src),
            None if joint or arch == "decoder_only" else len(toks.tgt),
            pad_id=toks.src.pad_id,
            bos_id=toks.src.bos_id,
            eos_id=toks.src.eos_id,
            sep_id=toks.src.sep_id,
        )
    except ConfigError as e:
        model_overrides = [o for o in overrides or [] if o.startswith("model.")]
        at_test = f" with the test-time overrides {' '.join(model_overrides)}" if model_overrides else ""
        raise LoadError(f"the model config of {run_dir}{at_test} is invalid: {e}") from e

    expected = model.state_dict()
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    if missing and len(missing) == len(expected) or (not state):
        fmt = meta.get("format", "no format tag")
        raise LoadError(
            f"{weights} is not a checkpoint of this project ({fmt}): none of its {len(state)} tensors "
            f"(e.g. {sorted(state)[:3]}) are parameters of the {arch} model of {run_dir / 'config.yaml'}"
        )
    vocab_names = _vocab_params(model)
    for name, side in vocab_names.items():
        if name in state and name in expected and state[name].shape[0] != expected[name].shape[0]:
            tok = toks.src if side == "source" else toks.tgt
            raise LoadError(
                f"the {side} tokenizer ({tok.model_path}, {len(tok)} pieces) does not match the "
                f"checkpoint {weights.name}, whose {name} has {state[name].shape[0]} rows: use the "
                "SentencePiece model(s) saved with this run"
            )
    bad_shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs config {tuple(expected[k].shape)}"
        for k in sorted(expected.keys() & state.keys())
        if state[k].shape != expected[k].shape
    ]
    if missing or unexpected or bad_shapes:
        raise LoadError(
            f"{weights} does not fit the model described by the run's config ({arch}): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatches {bad_shapes[:5]}"
        )
    model.load_state_dict(state, strict=True)
    model.to(resolve_device(device)).eval()
    return LoadedRun(model=model, tokenizers=toks, cfg=cfg, run_dir=run_dir, checkpoint=weights)


def merge_generation(base: Any, overrides: Any) -> GenerationConfig:
    """The run's generation settings (``base``, None: defaults) with every non-null field of
    ``overrides`` on top (null means "keep the run's"), typed and validated.

    Raises:
        ConfigError: an unknown field, a wrong type or an invalid value (named).
    """
    merged = OmegaConf.structured(GenerationConfig)
    try:
        if base is not None:
            merged = OmegaConf.merge(merged, base)
        if overrides is not None:
            items = overrides.items() if hasattr(overrides, "items") else dict(overrides).items()
            merged = OmegaConf.merge(merged, {k: v for k, v in items if v is not None})
    except Exception as e:
        raise ConfigError(f"invalid generation settings: {e}") from e
    validate_generation_config(merged)
    return OmegaConf.to_object(merged)
