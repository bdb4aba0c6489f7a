"""Whether the runs of one table are comparable: they may differ in the study's switches and the
seed only. A run's recipe is its resolved config without :data:`~transformer.config.IGNORED_KEYS`
and the switches, plus what the machine decided (the resolved ``train.precision``, the torch
version). One key is coupled to a switch (:data:`COUPLED`): the decoder-only step doubles
``train.max_tokens``, so it may differ across ``model.arch``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformer.analysis.collect import Run
from transformer.analysis.grouping import Configuration
from transformer.config import IGNORED_KEYS, flatten_config, is_ignored, with_defaults

__all__ = [
    "COUPLED",
    "SWITCH_PREFIXES",
    "MixedField",
    "MixedRunsError",
    "mixed_fields",
    "mixed_runs_message",
    "recipe_of",
    "repeated_seeds",
]

SWITCH_PREFIXES: tuple[str, ...] = ("model", "plugin_files")
"""Config keys the configurations of a study are meant to differ in (a key covers those below it):
the switches, and the plugin files behind a plugin's option (a run of ``model/ffn=reglu`` records
``plugin_files.reglu/...``, its baseline none). They still tell configurations apart: two runs of
one plugin option whose files differ are two configurations, not two seeds of one."""

COUPLED: dict[str, str] = {"train.max_tokens": "model.arch"}
"""Recipe keys that may differ between runs that differ in the switch they are coupled to."""


class MixedRunsError(ValueError):
    """The runs of one table differ in more than the switches and the seed (the message names them)."""


@dataclass
class MixedField:
    """A recipe key whose value is not the same for every run: ``key`` (dotted) and ``values``
    (``{value as text: [run folders]}``, first seen first)."""

    key: str
    values: dict[str, list[str]]

    def sentence(self, limit: int = 3) -> str:
        """``key: v1 (run_a, run_b), v2 (run_c)``, naming at most ``limit`` runs per value."""
        parts = []
        for value, runs in self.values.items():
            names = ", ".join(runs[:limit]) + (f" and {len(runs) - limit} more" if len(runs) > limit else "")
            parts.append(f"{value} ({names})")
        return f"{self.key}: {'; '.join(parts)}"


def recipe_of(run: Run, ignore: Sequence[str] = IGNORED_KEYS) -> dict[str, Any]:
    """The flat recipe of a finished run; a key its config lacks takes its default (the behaviour it had)."""
    flat = with_defaults(run.trained_config or {})
    recipe = {k: v for k, v in flat.items() if not is_ignored(k, ignore) and not is_ignored(k, SWITCH_PREFIXES)}
    hardware = (run.results or {}).get("hardware")
    recipe["torch"] = hardware.get("torch") if isinstance(hardware, dict) else None
    return recipe


def _name(run: Run) -> str:
    return run.run_dir.name if run.run_dir.name not in ("", ".") else str(run.run_dir)


def _value_text(recipe: dict, key: str) -> str:
    """A recipe's value of ``key`` as text, ``"missing"`` when it has none."""
    return "missing" if key not in recipe else str(recipe[key])


def mixed_fields(configs: Sequence[Configuration], ignore: Sequence[str] = IGNORED_KEYS) -> list[MixedField]:
    """One :class:`MixedField` per recipe key in which the finished runs of ``configs`` differ, in key order."""
    runs = [r for c in configs for r in c.runs]
    recipes = [(r, recipe_of(r, ignore)) for r in runs]
    flats = {id(r): flatten_config(r.config or {}) for r in runs}
    keys = sorted({k for _, rec in recipes for k in rec})
    mixed = []
    for key in keys:
        groups: dict[str, list[str]] = {}
        for run, rec in recipes:
            groups.setdefault(_value_text(rec, key), []).append(_name(run))
        if len(groups) < 2:
            continue
        coupled = COUPLED.get(key)
        if coupled is not None:  # allowed when the value is a function of the coupled switch
            by_switch: dict[str, set[str]] = {}
            for run, rec in recipes:
                by_switch.setdefault(str(flats[id(run)].get(coupled)), set()).add(_value_text(rec, key))
            if all(len(v) == 1 for v in by_switch.values()):
                continue
        mixed.append(MixedField(key, groups))
    return mixed


def mixed_runs_message(mixed: Sequence[MixedField]) -> str:
    """The sentence :class:`MixedRunsError` carries."""
    return (
        "the runs of this table differ in more than the study's switches (model.*, plugin_files) and the seed: "
        + "; ".join(m.sentence() for m in mixed)
        + ". Compare runs trained and decoded alike (same precision, budget, data, decoding and torch), or pass "
        "--allow-mixed to show the differences in the table"
    )


def repeated_seeds(configs: Sequence[Configuration]) -> str | None:
    """The sentence for configurations holding two finished runs of one seed (a copied folder, or two
    evaluations of one run), None when none does: a row counts each seed once."""
    found = []
    for c in configs:
        by_seed: dict[int, list[str]] = {}
        for r in c.runs:
            if r.seed is not None:
                by_seed.setdefault(r.seed, []).append(_name(r))
        found += [
            f"{c.label!r} has seed {seed} {len(names)} times ({', '.join(names)})"
            for seed, names in by_seed.items()
            if len(names) > 1
        ]
    if not found:
        return None
    return (
        "; ".join(found) + ": a row holds one run per seed. Two evaluations of one run (e.g. of two of its "
        "checkpoints) are one seed: compare them in separate tables, or keep one"
    )
