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
    """One sentence per plugin option of a model config that reaches the exported model (no exporter
    maps them); a training-only option (``lr_scheduler``) is never refused."""
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
    """A new dict of a run config kept beside an exported model, readable here: a training-only option
    of a plugin not imported here is dropped with a note (its group back to the default), and
    ``plugins`` / ``plugin_files`` keep only the plugins whose options remain."""
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
    """Whether the config's ``model/attention`` option caches a latent (MLA); an unknown option is not."""
    kind = ATTENTION_KINDS.get(cfg.attention.name)
    return kind is not None and kind.latent


class ExportError(ValueError):
    """A model a target format cannot represent (the switches named), or an output folder that cannot be written."""


def refuse(target: str, reasons: Sequence[str]) -> None:
    """Raise :class:`ExportError` listing every reason the ``target`` cannot hold the model; return when none."""
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
    """One sentence per attention switch (MLA, QK-norm, sliding window, RoPE scaling, key/value head
    kind) the ``target`` lacks.

    Args:
        qk_norm: the ``model.qk_norm`` norms the target has.
        rope_types: the RoPE scaling types besides ``default`` it has.
        kinds: the ``model/attention`` options it holds (default :data:`KV_HEAD_KINDS`).
        sliding_window: it has one window for every layer (Mistral's), so only a local/global pattern
            is refused.
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
    """Yield a temporary folder next to ``out`` that becomes ``out`` only when the block succeeds (an
    exception deletes it); ``force`` replaces an existing ``out``.

    Raises:
        ExportError: ``out`` exists without ``force``, or is a file.
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
