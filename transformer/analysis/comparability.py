"""Whether the runs of one table are comparable: they may differ in the study's switches and the
seed only.

A run's *recipe* is its resolved config without the keys that never change what it computes
(:data:`~transformer.config.IGNORED_KEYS`: seed, the study's name, paths, logging,
threads) and without the switches (``model.*`` and the plugin files behind them), plus what the machine decided: ``train.precision``
as resolved (``results["precision"]``: ``auto`` is fp32 on one CPU and bf16 on another) and the
torch version (``results["hardware"]["torch"]``). Every run of a table must have the same recipe:
the same budget, data, optimiser, schedule, criterion, decoding, precision and torch. One exception
is coupled to a switch (:data:`COUPLED`): the decoder-only ladder step doubles ``train.max_tokens``
because its rows hold source and target, so ``train.max_tokens`` may differ between runs whose
``model.arch`` differs (and must agree among runs of the same ``model.arch``).
"""

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
    """A recipe key whose value is not the same for every run.

    Attributes:
        key: the dotted key (``train.precision``, ``torch``, ``train.max_updates``, ...).
        values: ``{value as text: [run folders]}``, in first-seen order.
    """

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
    """The flat recipe of a finished run (see the module docstring). A key the run's config lacks
    (a field added to the schema after the run trained) takes its default, which by the project's
    rule is the behaviour the run had."""
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
    """The recipe keys in which the finished runs of ``configs`` differ (beyond :data:`COUPLED` ones).

    Args:
        configs: the table's configurations (their finished runs are compared).
        ignore: config keys that never count.

    Returns:
        One :class:`MixedField` per key that differs, in key order; empty when the runs are comparable.
    """
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
    """The sentence for configurations holding two finished runs of one seed, None when none does.

    A row's runs are its seeds: its mean, its seed-to-seed spread (the noise floor) and its
    seed-matched bootstrap pairs count each seed once. Two runs of one configuration and seed are
    not two seeds: the same folder copied twice, or two evaluations (``scripts/evaluate.py``) of
    one run's checkpoints (say ``checkpoint_best`` and an average), whose config is the same.
    """
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
