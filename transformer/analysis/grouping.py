"""Grouping runs into configurations: runs of the same identity (:mod:`transformer.config.identity`:
the resolved config without the keys in :data:`IGNORED_KEYS`, a plugin's files only where its option
is chosen) are one configuration (its seeds), labelled by what tells the configurations apart (a
``ladder`` step's name when it alone does). A key a run's config lacks (recorded before the field
existed) counts as the field's default in :class:`~transformer.config.Config`, so seeds of one design
trained before and after a new switch was added stay one configuration."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformer.analysis.collect import Run, natural_key
from transformer.config import IGNORED_KEYS, flatten_config, identity_key, is_ignored, with_defaults
from transformer.runs.folder import test_time_tag

__all__ = ["IGNORED_KEYS", "Configuration", "flatten_config", "group_runs", "is_ignored", "with_defaults"]

# Choices shown first when they name a configuration.
_LABEL_CHOICES = ("ladder", "experiment", "model")


@dataclass
class Configuration:
    """The runs of one configuration (all seeds), finished and missing."""

    key: str
    label: str
    config: dict | None
    choices: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    missing: list[Run] = field(default_factory=list)


def _fmt_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _test_time(c: Configuration) -> str:
    """`` + <tag> at test time`` for a configuration of evaluations at test-time settings, else ``""``."""
    tag = test_time_tag(c.runs[0].test_time) if c.runs else ""
    return f" + {tag} at test time" if tag else ""


def _labels(configs: list[Configuration]) -> None:
    """Name each configuration by the choices (then config values) that differ between them; an
    evaluation at test-time settings (``scripts/evaluate.py``) adds them to its name."""
    if len(configs) == 1:
        c = configs[0]
        c.label = next((c.choices[k] for k in _LABEL_CHOICES if k in c.choices), "run") + _test_time(c)
        return
    keys = sorted({k for c in configs for k in c.choices})
    varying = [k for k in keys if len({c.choices.get(k) for c in configs}) > 1]
    for k in _LABEL_CHOICES:  # a naming choice (a ladder step) that alone tells them apart names them
        if k in varying and len({c.choices.get(k) for c in configs}) == len(configs):
            for c in configs:
                c.label = str(c.choices.get(k, "none")) + _test_time(c)
            return
    for c in configs:
        parts = [(k, c.choices.get(k, "none")) for k in varying]
        if not parts:  # same choices: name by the main one, config values are added below
            c.label = next((c.choices[k] for k in _LABEL_CHOICES if k in c.choices), "")
        else:
            c.label = parts[0][1] if len(parts) == 1 else ", ".join(f"{k.split('/')[-1]}={v}" for k, v in parts)
        suffix = _test_time(c)
        if suffix:
            c.label = (c.label or "run") + suffix
    by_label: dict[str, list[Configuration]] = {}
    for c in configs:
        by_label.setdefault(c.label, []).append(c)
    for same in by_label.values():
        if len(same) < 2:
            continue
        flats = [json.loads(c.key) for c in same]
        diff = sorted({k for f in flats for k in f if len({json.dumps(g.get(k), default=str) for g in flats}) > 1})
        for c, f in zip(same, flats):
            extra = ", ".join(f"{k}={_fmt_value(f.get(k))}" for k in diff)
            c.label = f"{c.label}, {extra}" if c.label else extra
    seen: dict[str, int] = {}
    for c in configs:  # last resort: identical labels get a counter
        n = seen.get(c.label, 0)
        seen[c.label] = n + 1
        if n:
            c.label = f"{c.label} #{n + 1}"
    for c in configs:
        c.label = c.label or "run"


def group_runs(runs: Iterable[Run], ignore: Sequence[str] = IGNORED_KEYS) -> tuple[list[Configuration], list[Run]]:
    """Group runs into configurations (config equal up to ``ignore``), labelled and ordered.

    Order: by the ``ladder`` choice (natural order) when every configuration has one, else by first
    appearance. Unfinished runs join the configuration of their config; those without a readable
    config, or whose configuration has no finished run, are returned separately.

    Returns:
        ``(configurations, unmatched_missing_runs)``; configurations without a finished run are
        left out of the first list (their runs are in the second).
    """
    runs = list(runs)
    groups: dict[str, Configuration] = {}
    unmatched: list[Run] = []
    for run in runs:
        if run.config is None:
            unmatched.append(run)
            continue
        key = identity_key(run.trained_config, ignore)  # train.precision as resolved (auto -> fp32 | bf16)
        if key not in groups:
            groups[key] = Configuration(key=key, label="", config=run.config, choices=dict(run.choices))
        c = groups[key]
        if run.ok:
            c.runs.append(run)
            if not c.runs[:-1]:  # the first finished run defines the displayed choices/config
                c.config, c.choices = run.config, dict(run.choices)
        else:
            c.missing.append(run)
    configs = [c for c in groups.values() if c.runs]
    for c in groups.values():
        if not c.runs:
            unmatched.extend(c.missing)
            c.missing = []
    _labels(configs)
    if configs and all("ladder" in c.choices for c in configs):
        configs.sort(key=lambda c: natural_key(c.choices["ladder"]))
    for c in configs:
        c.runs.sort(key=lambda r: (r.seed is None, r.seed or 0, natural_key(str(r.run_dir))))
    return configs, unmatched
