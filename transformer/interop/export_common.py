"""Shared parts of the exporters: the refusal error, the all-or-nothing output folder, vocabularies."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor

from transformer.config import GROUPS, LR_SCHEDULERS
from transformer.modules.attention import ATTENTION_KINDS
from transformer.plugins import loaded_plugins, plugin_of, record_plugins

__all__ = [
    "ExportError",
    "KV_HEAD_KINDS",
    "attention_unsupported",
    "is_latent",
    "plugin_options_unsupported",
    "readable_run_config",
    "refuse",
    "staging_dir",
    "vocabulary",
    "state_dict_fp32",
]

KV_HEAD_KINDS = ("mha", "gqa", "mqa")
"""The ``model/attention`` options the HF/CTranslate2 attention classes hold: multi-head attention
with ``n_kv_heads`` key/value heads (each target narrows it further where it must)."""


_KIND_WORDS = {
    "mha": "multi-head attention",
    "gqa": "grouped-query attention",
    "mqa": "multi-query attention",
    "mla": "multi-head latent attention",
}


def plugin_options_unsupported(cfg: Any) -> list[str]:
    """One sentence per option of a model config that a plugin registered
    (:data:`transformer.plugins.ORIGINS`) and that reaches the exported model (``model/attention``,
    ``model/ffn``, ``model/norm``, ``model/position``, its RoPE scaling, ``model.qk_norm``, a mixture
    of experts' expert and router): no exporter maps them, whatever their shape. A plugin's
    training-only option (``lr_scheduler``) shapes no weight and is never refused."""
    rope = getattr(getattr(cfg.position, "rope_scaling", None), "rope_type", "default")
    chosen = [
        ("model/attention", "model/attention", cfg.attention.name),
        ("model/ffn", "model/ffn", cfg.ffn.name),
        ("model/norm", "model/norm", cfg.norm.name),
        ("model/position", "model/position", cfg.position.name),
        ("model.position.rope_scaling.rope_type", "model/position/rope_scaling", rope),
        ("model.qk_norm", "model/norm", getattr(cfg, "qk_norm", "none")),
    ]
    if cfg.ffn.name == "moe":
        chosen += [
            ("model.ffn.expert", "model/ffn", cfg.ffn.expert),
            ("model.ffn.router", "model.ffn.router", cfg.ffn.router),
        ]
    why = []
    for label, switch, option in chosen:
        owner = plugin_of(switch, option)
        if owner is not None:
            why.append(
                f"{label}={option}: an option of the plugin {owner}; the exporters map the zoo's own options only"
            )
    return why


_TRAINING_OPTIONS = {"lr_scheduler": LR_SCHEDULERS}
"""The groups of a run config that do not reach the exported model, and the options known here (built
in, or registered by a plugin imported in this process)."""


def readable_run_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A run config kept beside an exported model (``transformer_zoo.yaml``, a plain dict) made readable
    in this process: a training-only option (``lr_scheduler``) of a plugin that is not imported here
    (``plugins=[...]`` names it) is dropped with a note on stderr, the group taking its default, and
    ``plugins`` / ``plugin_files`` then hold only the plugins whose options remain (those imported
    here, recorded from where they were imported). The model's options come from ``config.json``.

    Args:
        raw: the run config as a plain dict (not changed).

    Returns:
        A new dict.
    """
    raw = dict(raw)
    dropped, kept = [], set()
    for group in GROUPS.values():
        known = _TRAINING_OPTIONS.get(group.path)
        node = raw.get(group.path)
        if known is None or not isinstance(node, dict) or node.get(group.key) is None:
            continue
        name = str(node[group.key])
        owner = plugin_of(group.switch, name)
        if name not in known:
            dropped.append(f"{group.switch}={name}")
            del raw[group.path]
            default = getattr(group.base(), group.key)
            print(
                f"note: {group.switch}={name} is an option of a plugin not imported here (name it with plugins=[...] "
                f"to keep its fields); the imported run has the default {group.switch}={default}",
                file=sys.stderr,
            )
        elif owner is not None:
            kept.add(owner)
    if dropped or kept:
        plugins = [p for p in loaded_plugins() if p.name in kept]
        raw["plugins"], raw["plugin_files"] = record_plugins(plugins)
    return raw


def is_latent(cfg: Any) -> bool:
    """Whether the model config's ``model/attention`` option caches a latent (multi-head latent
    attention), asked of its :data:`~transformer.modules.attention.ATTENTION_KINDS` entry (an option
    missing from the table, e.g. a plugin's that is not loaded, counts as not latent)."""
    kind = ATTENTION_KINDS.get(cfg.attention.name)
    return kind is not None and kind.latent


class ExportError(ValueError):
    """A model a target format cannot represent, or an output folder that cannot be written.

    The message names the switches (e.g. ``model/position=alibi``) that stand in the way.
    """


def refuse(target: str, reasons: Sequence[str]) -> None:
    """Raise :class:`ExportError` listing every reason, or return when there is none.

    Args:
        target: what was asked for, e.g. ``"Hugging Face MarianMTModel"``.
        reasons: one sentence per switch the target cannot represent.

    Raises:
        ExportError: ``reasons`` is not empty.
    """
    if reasons:
        raise ExportError(f"cannot export to {target}: " + "; ".join(reasons))


def attention_unsupported(
    cfg: Any,
    target: str,
    *,
    qk_norm: tuple[str, ...] = (),
    rope_types: tuple[str, ...] = (),
    kinds: tuple[str, ...] = KV_HEAD_KINDS,
    sliding_window: bool = False,
) -> list[str]:
    """The attention switches (MLA, QK-norm, sliding window, RoPE scaling, key/value head kinds) a
    target lacks, one sentence each (empty when it has them all).

    Args:
        cfg: a model config (fields missing from configs written before them count as off).
        target: the target's name, for the sentences.
        qk_norm: the ``model.qk_norm`` norms the target has (none by default).
        rope_types: the ``model.position.rope_scaling.rope_type`` values besides ``default`` it has.
        kinds: the ``model/attention`` options the target holds (default :data:`KV_HEAD_KINDS`;
            DeepSeek-V3: ``("mla",)``); any other option, a plugin's included, is refused by name.
        sliding_window: whether the target has one sliding window for every layer (Mistral's
            ``sliding_window``): then ``model.attention_window`` is kept and only a local/global
            pattern (``model.attention_window_pattern``) is refused.
    """
    why = []
    name = cfg.attention.name
    if name not in kinds:
        words = ", ".join(_KIND_WORDS.get(k, k) for k in kinds)
        why.append(f"model/attention={name}: {target}'s attention is {words} (model/attention={'|'.join(kinds)})")
    norm = getattr(cfg, "qk_norm", "none")
    if norm != "none" and norm not in qk_norm:
        why.append(
            f"model.qk_norm={norm}: {target} has no {norm} QK-norm"
            + (f" (it has {', '.join(qk_norm)})" if qk_norm else "")
        )
    window = getattr(cfg, "attention_window", None)
    every = getattr(cfg, "attention_window_pattern", 0) or 0
    if window is not None and sliding_window and every:
        why.append(
            f"model.attention_window_pattern={every}: {target} applies its sliding window to every layer "
            "(model.attention_window_pattern=0)"
        )
    if window is not None and not sliding_window:
        why.append(
            f"model.attention_window={window}: {target} is exported with global attention only "
            "(sliding windows are not exported)"
        )
    scaling = getattr(cfg.position, "rope_scaling", None)
    rope_type = "default" if scaling is None else scaling.rope_type
    if rope_type != "default" and rope_type not in rope_types:
        why.append(
            f"model.position.rope_scaling.rope_type={rope_type}: {target} has no such RoPE scaling"
            + (f" (it has {', '.join(rope_types)})" if rope_types else "")
        )
    return why


@contextmanager
def staging_dir(out: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """A temporary folder next to ``out`` that becomes ``out`` only when the block succeeds.

    On any exception the temporary folder is deleted and ``out`` is untouched, so no half-written
    export ever sits at ``out``. With ``force`` an existing ``out`` is replaced (moved aside, then
    deleted after the rename).

    Args:
        out: the final folder.
        force: replace an existing ``out``.

    Yields:
        The temporary folder to write into.

    Raises:
        ExportError: ``out`` exists and ``force`` is false, or it is a file.
    """
    out = Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out} already exists: choose another out= or pass force=true to replace it")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}.old")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def vocabulary(tokenizer: Any) -> list[str]:
    """The pieces of a :class:`~transformer.data.Tokenizer` in id order (``["<pad>", "<unk>", ...]``)."""
    return [tokenizer.id_to_piece(i) for i in range(len(tokenizer))]


def state_dict_fp32(model: Any) -> dict[str, Tensor]:
    """The model's state dict on the CPU in fp32, detached (tied matrices appear under each name)."""
    return {k: v.detach().to("cpu").float() for k, v in model.state_dict().items()}
