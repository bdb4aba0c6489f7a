"""The rules on a config field, declared where the field is declared: **resume** (``fixed``, ``free``
or ``always``: what a resumed run takes from the command line) and **grouping** (``defines`` or
``ignored``: whether runs that differ in it are different configurations). ``recipe(default)`` is
``fixed`` and ``defines``; ``rule(default, resume=..., grouping=...)`` spells out any other pair.
The lists the code reads derive from them (:func:`keys_with`). What each rule means:
docs/contributing.md#adding-a-config-field."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field
from typing import Any, NamedTuple, get_type_hints

__all__ = ["GROUPINGS", "RESUMES", "FieldRule", "field_rule", "keys_with", "recipe", "rule", "rule_table", "undeclared"]

RESUMES = ("fixed", "free", "always")
"""What a resumed run takes from the command line: nothing, the named value, the value named or not."""

GROUPINGS = ("defines", "ignored")
"""Whether a field tells configurations apart (``compare.py``, ``train.finished_runs``)."""

_KEY = "transformer.rule"


class FieldRule(NamedTuple):
    """A field's rule: ``resume`` one of :data:`RESUMES`, ``grouping`` one of :data:`GROUPINGS`."""

    resume: str
    grouping: str


def rule(default: Any = MISSING, *, factory: Callable[[], Any] | Any = MISSING, resume: str, grouping: str) -> Any:
    """``dataclasses.field`` with ``default`` (or ``factory``) and the rule in its metadata.

    Raises:
        ValueError: an unknown ``resume`` or ``grouping``.
    """
    if resume not in RESUMES:
        raise ValueError(f"resume={resume!r} is not one of {', '.join(RESUMES)}")
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping={grouping!r} is not one of {', '.join(GROUPINGS)}")
    return dataclasses.field(default=default, default_factory=factory, metadata={_KEY: FieldRule(resume, grouping)})


def recipe(default: Any = MISSING, *, factory: Callable[[], Any] | Any = MISSING) -> Any:
    """A field of what a run computes: fixed on resume, defines the configuration (:func:`rule`)."""
    return rule(default, factory=factory, resume="fixed", grouping="defines")


def field_rule(f: Field) -> FieldRule | None:
    """The rule ``f`` declares, or None."""
    return f.metadata.get(_KEY)


def rule_table(cls: type, prefix: str = "") -> dict[str, FieldRule | None]:
    """Dotted key (after ``prefix``) -> rule for every field of dataclass ``cls``; a ruleless field
    holding a dataclass is replaced by the fields below it, any other maps to None."""
    hints = get_type_hints(cls)
    table: dict[str, FieldRule | None] = {}
    for f in dataclasses.fields(cls):
        declared = field_rule(f)
        if declared is None and dataclasses.is_dataclass(hints[f.name]):
            table.update(rule_table(hints[f.name], f"{prefix}{f.name}."))
        else:
            table[prefix + f.name] = declared
    return table


def keys_with(cls: type, *, resume: Sequence[str] = RESUMES, grouping: Sequence[str] = GROUPINGS) -> tuple[str, ...]:
    """The dotted keys of ``cls`` (:func:`rule_table`, in declaration order) whose rule has one of
    ``resume`` and one of ``grouping``; a key covers the fields below it."""
    table = rule_table(cls)
    return tuple(k for k, r in table.items() if r is not None and r.resume in resume and r.grouping in grouping)


def undeclared(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` (and below) that declare no rule, each as
    ``"<dotted key> (<Class>.<field>)"``."""
    return [f"{key} ({_owner(cls, key)}.{key.rsplit('.', 1)[-1]})" for key, r in rule_table(cls).items() if r is None]


def _owner(cls: type, key: str) -> str:
    """The name of the dataclass declaring dotted ``key`` below ``cls``."""
    for part in key.split(".")[:-1]:
        cls = get_type_hints(cls)[part]
    return cls.__name__
