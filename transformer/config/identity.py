"""What makes two runs the same configuration, in one place: ``scripts/compare.py`` groups runs by it
(:mod:`transformer.analysis.grouping`), ``train.finished_runs`` reuses a finished twin by it
(:mod:`transformer.training.job.finished_runs`), and a resume continues only with the plugin code
it names (:mod:`transformer.training.job.run`).

A run's identity is its resolved config, flattened to dotted keys (:func:`with_defaults`: in this
version's shape, a key the run's config lacks at its default), without the keys that never change
what a run computes (:data:`IGNORED_KEYS`: the fields declared ``grouping="ignored"``, the seed, the
study's name, paths, logging, threads), and with a plugin's files (``plugin_files.<plugin>/...``) only
where the run selected one of that plugin's options (:func:`used_plugin_files`): a plugin loaded but
not chosen computes nothing, so runs with ``plugins=[...] model/position=rope`` and runs without
``plugins=`` are one configuration.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from transformer.config.convert import config_dict, upgrade_config
from transformer.config.options import LR_SCHEDULERS
from transformer.config.rules import keys_with
from transformer.config.schema import Config
from transformer.modules.attention import ATTENTION_KINDS
from transformer.modules.ffn import FFNS
from transformer.modules.moe_router import ROUTER_SCORES
from transformer.modules.norms import NORMS
from transformer.modules.positions import POSITIONS
from transformer.modules.rope_scaling import ROPE_SCALINGS
from transformer.plugins import ORIGINS

__all__ = [
    "IGNORED_KEYS",
    "config_identity",
    "flatten_config",
    "identity_key",
    "is_ignored",
    "used_plugin_files",
    "with_defaults",
]

IGNORED_KEYS: tuple[str, ...] = keys_with(Config, grouping=("ignored",))
"""Resolved-config keys (dotted; a key also covers everything below it) that do not define a
configuration: those whose rule, declared at the field in :mod:`transformer.config.schema`, says
``grouping="ignored"`` (:mod:`transformer.config.rules`): the seed, the study's name, where files
live, the machine's threads and how a run reports progress and resumes."""

PLUGIN_FILES = "plugin_files"
"""The config key of the plugins' file hashes, ``<plugin name>/<relative path> -> sha256``."""

_OPTIONS: dict[str, tuple[str, Callable[[], Iterable[str]]]] = {
    "model.attention.name": ("model/attention", lambda: ATTENTION_KINDS),
    "model.ffn.name": ("model/ffn", lambda: FFNS),
    "model.ffn.router": ("model.ffn.router", lambda: ROUTER_SCORES),
    "model.norm.name": ("model/norm", lambda: NORMS),
    "model.qk_norm": ("model/norm", lambda: NORMS),
    "model.position.name": ("model/position", lambda: POSITIONS),
    "model.position.rope_scaling.rope_type": ("model/position/rope_scaling", lambda: ROPE_SCALINGS),
    "lr_scheduler.name": ("lr_scheduler", lambda: LR_SCHEDULERS),
}
"""Each config key naming an option a plugin may register -> (the switch it registers it under, the
table of the options known in this process: built-in, and those of the plugins imported here)."""


def flatten_config(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{dotted key: leaf value}`` (an empty dict is a leaf)."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten_config(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def is_ignored(key: str, ignore: Sequence[str]) -> bool:
    """Whether dotted ``key`` is one of ``ignore`` or below one of them."""
    return any(key == k or key.startswith(k + ".") for k in ignore)


@functools.lru_cache(maxsize=1)
def _schema_defaults() -> tuple[tuple[str, Any], ...]:
    return tuple(flatten_config(config_dict(Config())).items())


def with_defaults(config: Mapping) -> dict[str, Any]:
    """``config`` in this version's shape (:func:`~transformer.config.upgrade_config`) and flattened,
    every key it lacks at this version's default (:class:`~transformer.config.Config`): a field added
    to the schema after a run trained defaults, by the project's rule, to what the run did."""
    return {**dict(_schema_defaults()), **flatten_config(upgrade_config(dict(config)))}


def _plugin(key: str) -> str:
    """The plugin a ``plugin_files`` entry belongs to (``relbias/__init__.py`` -> ``relbias``)."""
    return key.split("/", 1)[0]


def _used_plugins(flat: Mapping[str, Any], plugins: set[str]) -> set[str]:
    """Which of ``plugins`` the flattened config selects an option of. An option a plugin registered
    in this process names its plugin (:data:`~transformer.plugins.ORIGINS`); an option this process
    knows neither as built-in nor as an imported plugin's is one of the run's plugins not imported
    here, which one unknown: then every one of them counts."""
    used: set[str] = set()
    for key, (switch, table) in _OPTIONS.items():
        value = flat.get(key)
        if value is None or str(value) == "none":
            continue
        owner = ORIGINS.get((switch, str(value)))
        if owner is not None:
            used.add(owner)
        elif str(value) not in table():
            return set(plugins)
    return used & plugins


def _files(flat: Mapping[str, Any]) -> dict[str, str]:
    """The ``plugin_files`` entries of a flattened config, by their own keys."""
    prefix = PLUGIN_FILES + "."
    return {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}


def _used_files(flat: Mapping[str, Any]) -> dict[str, str]:
    files = _files(flat)
    used = _used_plugins(flat, {_plugin(k) for k in files})
    return {k: v for k, v in files.items() if _plugin(k) in used}


def used_plugin_files(config: Mapping) -> dict[str, str]:
    """The ``plugin_files`` entries of ``config`` (a run's config, nested) that belong to a plugin whose
    option the run selected (module docstring); ``{}`` when it selected none."""
    return _used_files(flatten_config(dict(config)))


def config_identity(config: Mapping, ignore: Sequence[str] = IGNORED_KEYS) -> dict[str, Any]:
    """The flattened config (:func:`with_defaults`) that defines ``config``'s configuration: without
    the keys of ``ignore``, its plugins' files only where it selected one of their options."""
    flat = with_defaults(config)
    out = {k: v for k, v in flat.items() if not is_ignored(k, (*ignore, PLUGIN_FILES))}
    if not is_ignored(PLUGIN_FILES, ignore):
        kept = {f"{PLUGIN_FILES}.{k}": v for k, v in _used_files(flat).items()}
        out.update(kept or {PLUGIN_FILES: {}})
    return out


def identity_key(config: Mapping, ignore: Sequence[str] = IGNORED_KEYS) -> str:
    """:func:`config_identity` as one string, equal for configs of the same configuration."""
    return json.dumps(config_identity(config, ignore), sort_keys=True, default=str)
