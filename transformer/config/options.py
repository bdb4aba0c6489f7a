"""The config groups whose options may carry fields of their own, and the typed node of each option.

Each model switch group and ``lr_scheduler`` is a node told apart by one field (``name``, or
``rope_type``) with a base dataclass (:class:`OptionGroup`). An option with more fields has a
subclass registered here (``mla`` -> :class:`~transformer.config.schema.LatentAttentionConfig`),
whose fields exist under the node only when that option is chosen. Hydra learns them through the
ConfigStore as ``schema/<group>/<name>`` (its "config group schema" pattern); a plugin option
without a YAML file is stored as the option itself."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from transformer.config.schema import (
    AttentionConfig,
    Config,
    ConfigError,
    FFNConfig,
    GenerationOverrides,
    LatentAttentionConfig,
    NormConfig,
    PositionConfig,
    RopeScalingConfig,
    RopeScalingOverrides,
    SchedulerConfig,
)

__all__ = [
    "GROUPS",
    "LR_SCHEDULERS",
    "OptionGroup",
    "flat_group_override",
    "option_config",
    "register_configs",
    "register_option_config",
    "store_option_schemas",
    "store_plugin_option",
    "structured_config",
]


@dataclass
class OptionGroup:
    """One config group whose options are told apart by one field.

    Attributes:
        switch: the group on the command line (``model/attention``).
        path: its node in :class:`~transformer.config.Config` (``model.attention``).
        key: the field naming the option (``name``; ``rope_type`` for RoPE scalings).
        base: the dataclass of the fields every option reads.
        options: option name -> its own subclass of ``base``, for options with fields of their own.
        stored: options stored in the ConfigStore as options (plugins without a YAML file).
        plain: those of them without fields of their own.
    """

    switch: str
    path: str
    key: str
    base: type
    options: dict[str, type] = field(default_factory=dict)
    stored: set[str] = field(default_factory=set)
    plain: set[str] = field(default_factory=set)


GROUPS: dict[str, OptionGroup] = {
    g.switch: g
    for g in (
        OptionGroup("model/attention", "model.attention", "name", AttentionConfig, {"mla": LatentAttentionConfig}),
        OptionGroup("model/ffn", "model.ffn", "name", FFNConfig),
        OptionGroup("model/norm", "model.norm", "name", NormConfig),
        OptionGroup("model/position", "model.position", "name", PositionConfig),
        OptionGroup("model/position/rope_scaling", "model.position.rope_scaling", "rope_type", RopeScalingConfig),
        OptionGroup("lr_scheduler", "lr_scheduler", "name", SchedulerConfig),
    )
}
"""Switch -> :class:`OptionGroup`, parents before the groups nested in them."""


LR_SCHEDULERS: list[str] = ["inverse_sqrt", "cosine", "constant"]
"""The ``lr_scheduler.name`` options validation accepts: the built-in schedules
(``transformer.training.step.schedules``), then those plugins register."""


def option_config(switch: str, name: str) -> type:
    """The dataclass of option ``name`` of group ``switch`` (the group's base when it has none of its own).

    Raises:
        KeyError: ``switch`` is not a group of :data:`GROUPS`.
    """
    group = GROUPS[switch]
    return group.options.get(name, group.base)


def store_plugin_option(switch: str, name: str) -> None:
    """Make ``<switch>=<name>`` select an option registered without fields of its own (a plugin's
    norm, FFN or schedule without a YAML file): its node is the group's base with ``key`` = ``name``."""
    group = GROUPS[switch]
    group.plain.add(name)
    store_option_schemas()


def register_option_config(switch: str, name: str, config: type, *, store_option: bool = False) -> None:
    """Give option ``name`` of group ``switch`` its own fields: ``config``, a dataclass subclassing the
    group's base whose ``key`` field defaults to ``name``. ``store_option`` also stores it as the
    option, so ``<switch>=<name>`` selects it without a YAML file (plugins).

    Raises:
        ConfigError: an unknown group, a class that is not a dataclass subclass of the base, a ``key``
            default other than ``name``, or a name another class holds.
    """
    if switch not in GROUPS:
        raise ConfigError(f"no config group {switch!r}; groups with option fields: {', '.join(GROUPS)}")
    group = GROUPS[switch]
    if not (isinstance(config, type) and dataclasses.is_dataclass(config) and issubclass(config, group.base)):
        raise ConfigError(
            f"the fields of {switch}={name} must be a dataclass subclassing {group.base.__name__}, got {config!r}"
        )
    default = {f.name: f.default for f in dataclasses.fields(config)}.get(group.key)
    if default != name:
        raise ConfigError(
            f"{config.__name__}.{group.key} must default to {name!r} (the option it describes), got {default!r}"
        )
    held = group.options.get(name)
    if held is not None and held is not config:
        raise ConfigError(f"{switch}={name} already has its fields ({held.__module__}.{held.__qualname__})")
    group.options[name] = config
    if store_option:
        group.stored.add(name)
    store_option_schemas()


def store_option_schemas() -> None:
    """Store every option class in Hydra's ConfigStore: ``schema/<switch>/<name>`` (named first in the
    option's YAML defaults list) and, for options registered with ``store_option``, ``<switch>/<name>``."""
    cs = ConfigStore.instance()
    for group in GROUPS.values():
        for name, config in group.options.items():
            cs.store(group=f"schema/{group.switch}", name=name, node=config, package=group.path)
            if name in group.stored:
                cs.store(group=group.switch, name=name, node=config, package=group.path)
        for name in group.plain:
            cs.store(group=group.switch, name=name, node={group.key: name}, package=group.path)


def _select(cfg: Any, path: str) -> Any:
    node = cfg
    for part in path.split("."):
        if isinstance(node, (dict, DictConfig)) and part in node:
            node = node[part]
        else:
            return None
    return node


def structured_config(cfg: Any = None) -> DictConfig:
    """The structured :class:`~transformer.config.Config` that ``cfg`` (a whole config, or None) merges
    into, each group's node typed by the option ``cfg`` chooses.

    Raises:
        ConfigError: a group node of ``cfg`` that is not a mapping.
    """
    base = OmegaConf.structured(Config)
    for group in GROUPS.values():
        node = _select(cfg, group.path)
        if node is None:
            continue
        if not isinstance(node, (dict, DictConfig)):
            raise ConfigError(
                f"{group.path} is the {group.switch} group, got {node!r}; choose an option with "
                f"{group.switch}=<option> (or set {group.path}.{group.key})"
            )
        name = node.get(group.key)
        config = option_config(group.switch, str(name)) if name is not None else group.base
        if config is not group.base:
            OmegaConf.update(base, group.path, OmegaConf.structured(config), merge=False)
    return base


def register_configs() -> None:
    """Register ``base_config`` (:class:`Config`), ``generation_overrides``, ``rope_scaling_overrides``
    and the option classes with Hydra's ConfigStore; ``configs/train.yaml`` names ``base_config``
    first, so every YAML value is type-checked at composition."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="generation_overrides", node=GenerationOverrides)
    cs.store(name="rope_scaling_overrides", node=RopeScalingOverrides)
    store_option_schemas()


def flat_group_override(overrides: list[str]) -> str | None:
    """The sentence refusing an override like ``model.attention=gqa`` where the group takes
    ``model/attention=gqa`` (Hydra's own error does not say what to type), or None."""
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        for group in GROUPS.values():
            if sep and "/" in group.switch and key == group.path:
                return (
                    f"{override}: {group.path} is the {group.switch} group; choose its option with "
                    f"{group.switch}={value} (and set its fields as {group.path}.<field>=...)"
                )
    return None
