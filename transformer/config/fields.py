"""Every key of a config must be a field of its typed node, and every config group value one of its
options: an unknown one is refused in one sentence naming the nearest, never dropped.

A key a node lacks arrives by an override (with Hydra's ``+`` or without) or in an experiment's,
ladder step's or plugin's YAML file; :func:`check_command_line` composes the command line once
before Hydra runs, so no job of a refused sweep starts. Examples: docs/runs.md#errors-and-exit-codes."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import DictConfig, OmegaConf

from transformer.config import schema
from transformer.config.options import GROUPS, structured_config
from transformer.config.schema import ConfigError

__all__ = [
    "UnknownOption",
    "check_command_line",
    "check_known_fields",
    "unknown_field_sentence",
    "unknown_fields",
    "unknown_option_sentence",
]


class UnknownOption(ConfigError):
    """A command line's value of a config group that is no option of the group (the message names the
    group's options and the nearest)."""


_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn"}
"""Hydra's flags that take a value (the next argument, or ``--flag=value``)."""
_NO_CHECK = {"--help", "-h", "--hydra-help", "--version", "--info", "-i", "--shell-completion", "-sc"}
"""Hydra's flags that compose no config of the job: nothing is checked before Hydra runs."""
_OWN_PRIMARY = {"--config-path", "-cp", "--config-dir", "-cd", "--experimental-rerun"}
"""Hydra's flags that name config folders of their own (or a pickled config): the job checks its
config when it starts (:func:`check_known_fields`), not this module before Hydra runs."""
_MAX_COMPOSES = 64
"""A sweep of config groups is composed once per option of each swept group, at most this often."""
_NOT_OVERRIDABLE = re.compile(r"Could not override '([^']+)'")
_IN_FILE = re.compile(r"In '([^']+)': Config(?:Key|Attribute)Error raised while composing config")
_FULL_KEY = re.compile(r"full_key: (\S+)")
_NEAR_OPTION = 0.4
"""The least :class:`difflib.SequenceMatcher` ratio of an option suggested for a misspelt one (``rotary``
-> ``rope`` is 0.4: option names are short, so a low bar; field names keep difflib's 0.6)."""
_OBJECT_TYPE = re.compile(r"object_type=(\w+)")


def _dataclasses() -> dict[str, type]:
    """Every dataclass a config node can be typed by, by name: the schema's and each group option's
    (those plugins register included)."""
    found = {name: cls for name, cls in vars(schema).items() if isinstance(cls, type) and dataclasses.is_dataclass(cls)}
    for group in GROUPS.values():
        found.update({cls.__name__: cls for cls in group.options.values()})
    return found


def _group_at(path: str):
    return next((g for g in GROUPS.values() if g.path == path), None)


def unknown_field_sentence(path: str, known: Sequence[str], *, option: str | None = None, source: str = "") -> str:
    """``<path> [(in <source>)] is not a field of <parent> [(<group>=<option>)]; did you mean ...?``,
    or the option of the group that has the field, or the node's fields when none is near."""
    parent, _, leaf = path.rpartition(".")
    where = f"{parent}" if parent else "the config"
    group = _group_at(parent)
    if group is not None and option is not None:
        where += f" ({group.switch}={option})"
    sentence = f"{path}{f' (in {source})' if source else ''} is not a field of {where}"
    if group is not None:
        holders = sorted(
            name
            for name, cls in group.options.items()
            if name != option and leaf in {f.name for f in dataclasses.fields(cls)}
        )
        if holders:
            return f"{sentence}; it is a field of {' and '.join(f'{group.switch}={h}' for h in holders)}"
    close = difflib.get_close_matches(leaf, list(known), n=3, cutoff=0.6)
    prefix = f"{parent}." if parent else ""
    if close:
        return f"{sentence}; did you mean {' or '.join(prefix + c for c in close)}?"
    return f"{sentence}; its fields: {', '.join(sorted(known))}"


def unknown_option_sentence(group: str, value: str, options: Sequence[str]) -> str:
    """``<group>=<value> is not an option of <group>; did you mean <nearest>? (options: ...)``; the
    nearest are within 0.1 of the best similarity and at least :data:`_NEAR_OPTION`."""
    ratios = {o: difflib.SequenceMatcher(None, value, o).ratio() for o in options}
    best = max(ratios.values(), default=0.0)
    near = sorted((o for o, r in ratios.items() if r >= max(_NEAR_OPTION, best - 0.1)), key=lambda o: -ratios[o])
    guess = f"; did you mean {' or '.join(near)}?" if near else ""
    return f"{group}={value} is not an option of {group}{guess} (options: {', '.join(sorted(options))})"


def _option_values(override) -> list[str]:
    """The option names a group override sets (each value of a sweep); none for a deletion, ``null``, or
    a sweep that cannot be enumerated (``glob``)."""
    if override.is_delete():
        return []
    if override.is_sweep_override():
        try:
            values = list(override.sweep_string_iterator())
        except HydraException:
            return []
    else:
        values = [override.value()]
    return [str(v) for v in values if isinstance(v, (str, int, float)) and not isinstance(v, bool)]


def unknown_options(config_dir: str | Path, config_name: str, overrides: Sequence[str]) -> list[str]:
    """The sentences (:func:`unknown_option_sentence`) of each value of a config group in ``overrides``
    that Hydra finds no option for, with ``config_name``'s search path and the overrides'
    ``hydra.searchpath`` (a plugin's config folders). Hydra's own groups (``hydra/launcher``) are left to
    :func:`~transformer.cli.check_hydra_plugins`; a key that is no group is a field."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    search = [o for o in overrides if o.lstrip("+").startswith("hydra.searchpath")]
    found: list[str] = []
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for override in parsed:
            group = override.key_or_group
            if "." in group or group.startswith("hydra"):
                continue
            values = _option_values(override)
            options = loader.get_group_options(group, config_name=config_name, overrides=search) if values else []
            for value in values:
                if options and value not in options:
                    found.append(unknown_option_sentence(group, value, options))
    return found


def _walk(node: DictConfig, typed: DictConfig, prefix: str) -> Iterator[str]:
    fields = [str(k) for k in typed.keys()]
    for key in node.keys():
        path = f"{prefix}{key}"
        if "/" in str(key):  # Hydra appends "+<group>=<option>" as a key when the group has no such option
            switch = GROUPS.get(str(key))
            value = node._get_node(key)._value()
            yield f"{key}={value} names no option of a config group" + (
                f"; a built-in {switch.path.rpartition('.')[2]} is set as {switch.path}.{switch.key}={value}"
                if switch is not None
                else ""
            )
            continue
        if key not in fields:
            group = _group_at(prefix[:-1])
            option = None if group is None else node._get_node(group.key)
            option = None if option is None else str(option._value())
            yield unknown_field_sentence(path, fields, option=option)
            continue
        child, child_typed = node._get_node(key), typed._get_node(key)
        if (
            isinstance(child, DictConfig)
            and isinstance(child_typed, DictConfig)
            and dataclasses.is_dataclass(OmegaConf.get_type(child_typed))
        ):
            yield from _walk(child, child_typed, f"{path}.")


def unknown_fields(cfg: Any) -> list[str]:
    """One :func:`unknown_field_sentence` per key of ``cfg`` its typed node lacks, in order (the
    ``hydra`` node and plain-mapping fields such as ``extra`` take any key)."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    node = OmegaConf.masked_copy(node, [k for k in node.keys() if k != "hydra"])
    return list(_walk(node, structured_config(node), ""))


def check_known_fields(cfg: Any) -> None:
    """Refuse a config holding a key its typed node does not have.

    Raises:
        ConfigError: every unknown key's sentence, joined by ``; ``.
    """
    if found := unknown_fields(cfg):
        raise ConfigError("; ".join(found))


def _yaml_key_sentence(err: BaseException) -> str | None:
    """The sentence for Hydra's error about an unknown key of a config file (an experiment's, a
    ladder step's, a plugin's), or None when ``err`` is another error."""
    text = "\n".join(str(e) for e in (err, err.__cause__) if e is not None)
    source, full_key, object_type = (_IN_FILE.search(text), _FULL_KEY.search(text), _OBJECT_TYPE.search(text))
    if source is None or full_key is None or object_type is None:
        return None
    cls = _dataclasses().get(object_type.group(1))
    if cls is None:
        return None
    known = [f.name for f in dataclasses.fields(cls)]
    group = _group_at(full_key.group(1).rpartition(".")[0])
    option = None
    if group is not None:
        option = next((f.default for f in dataclasses.fields(cls) if f.name == group.key), None)
    return unknown_field_sentence(full_key.group(1), known, option=option, source=source.group(1))


def _split(argv: Sequence[str]) -> tuple[list[str], str | None] | None:
    """The overrides and ``--config-name`` of Hydra's command line ``argv``; None
    when the command composes no job config (``--help``, ``--info``, ...) or names its own primary
    config folder."""
    overrides: list[str] = []
    values: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        flag, eq, value = arg.partition("=")
        if arg.startswith("-") and not arg.startswith("--") and "=" not in arg and arg not in _WITH_VALUE:
            if arg in _NO_CHECK or arg in _OWN_PRIMARY:
                return None
            continue  # -m, ...
        if arg.startswith("--"):
            if flag in _NO_CHECK or flag in _OWN_PRIMARY:
                return None
            if flag in _WITH_VALUE:
                values[flag] = value if eq else next(args, "")
            continue
        if arg in _WITH_VALUE:
            values[arg] = next(args, "")
            continue
        overrides.append(arg)
    return overrides, values.get("--config-name") or values.get("-cn")


def _variants(overrides: list[str]) -> Iterator[list[str]]:
    """The override lists to compose: each sweep at its first value, then each further option of a
    swept config group (a key without a dot) on its own. Sweeps that cannot be enumerated (Optuna's
    ``interval``, ``glob``) are left out; Hydra's own settings too, but the search path."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    base: list[str] = []
    swept: list[tuple[int, str, list[str]]] = []
    for arg, override in zip(overrides, parsed, strict=True):
        key = override.key_or_group
        if key.startswith("hydra") and key != "hydra.searchpath":
            continue
        if not override.is_sweep_override():
            base.append(arg)
            continue
        try:
            values = list(override.sweep_string_iterator())
        except HydraException:  # interval / glob: no values to compose
            continue
        if not values:
            continue
        base.append(f"{override.get_key_element()}={values[0]}")
        if "." not in key and len(values) > 1:
            swept.append((len(base) - 1, override.get_key_element(), values[1:]))
    yield base
    for at, key, values in swept:
        for value in values:
            yield [*base[:at], f"{key}={value}", *base[at + 1 :]]


def _compose_sentences(config_dir: Path, config_name: str, overrides: list[str]) -> list[str]:
    """Compose ``overrides`` and return the unknown keys' sentences. An override Hydra cannot set
    (no such key) is composed again with ``++`` (so that every unknown key is named at once); any
    other composition error returns nothing here (Hydra reports it as it does)."""
    overrides = list(overrides)
    for _ in range(len(overrides) + 1):
        try:
            with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
                cfg = compose(config_name=config_name, overrides=overrides)
        except ConfigCompositionException as err:
            if (sentence := _yaml_key_sentence(err)) is not None:
                return [sentence]
            match = _NOT_OVERRIDABLE.search(str(err))
            at = next(
                (i for i, o in enumerate(overrides) if match and o.lstrip("+~").split("=", 1)[0] == match.group(1)),
                None,
            )
            if at is None or overrides[at].startswith(("+", "~")):
                return []
            overrides[at] = "++" + overrides[at]
            continue
        except Exception:  # any other error is Hydra's to report, in its own words
            return []
        return unknown_fields(cfg)
    return []


def check_command_line(argv: Sequence[str], config_dir: str | Path, config_name: str) -> None:
    """Refuse, before Hydra runs, a command line choosing an unknown option or setting an unknown
    key; a multirun is composed at each sweep's first value and with each option of a swept group.

    ``argv``'s plugins must be imported already; ``config_name`` is the primary config (``train``).

    Raises:
        UnknownOption: the unknown options' sentences, joined by ``; ``.
        ConfigError: the unknown keys' sentences.
    """
    split = _split(argv)
    if split is None:
        return
    overrides, name = split
    try:
        variants = list(_variants(overrides))
        options = unknown_options(config_dir, name or config_name, overrides)
    except Exception:  # a command line Hydra's parser refuses: Hydra says why
        return
    if options:
        raise UnknownOption("; ".join(options))
    found: list[str] = []
    for variant in variants[:_MAX_COMPOSES]:
        for sentence in _compose_sentences(Path(config_dir), name or config_name, variant):
            if sentence not in found:
                found.append(sentence)
    if found:
        raise ConfigError("; ".join(found))
