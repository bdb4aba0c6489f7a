"""What the ``train`` fields mean while a run runs: the time budget, the values of ``train.resume``,
and the ``zoo.*`` resolvers of ``configs/train.yaml`` (where Hydra records a job, a sweep job's
folder name), registered when this module is imported."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, get_type_hints

from omegaconf import OmegaConf

from transformer.config.schema import Config
from transformer.runs.folder import has_checkpoint
from transformer.runs.hydra_record import record_subdir

__all__ = [
    "DEFAULT_TIME_BUDGET_S",
    "RESUME_MODES",
    "SWEPT_KEYS_ENV",
    "budget_sentence",
    "resume_mode",
    "sweep_subdir",
    "swept_keys",
    "swept_suffix",
    "time_budget",
]

SWEPT_KEYS_ENV = "TRANSFORMER_SWEPT_KEYS"
"""The variable through which ``scripts/train.py -m`` tells its jobs the keys it sweeps (comma-separated)."""


DEFAULT_TIME_BUDGET_S = 1380.0
"""The default run's budget: 23 minutes of training (``train.max_time`` null and no other budget)."""


def time_budget(train: Any) -> float:
    """Training seconds ``train`` stops at: ``train.max_time`` when set (0: none); when null,
    :data:`DEFAULT_TIME_BUDGET_S` unless ``train.max_updates`` or ``train.max_epochs`` is set (then 0)."""
    if train.max_time is not None:
        return float(train.max_time)
    return DEFAULT_TIME_BUDGET_S if train.max_updates <= 0 and train.max_epochs <= 0 else 0.0


def budget_sentence(train: Any) -> str:
    """What stops a run, in words (logged at the start): ``"train.max_updates=4000"``,
    ``"1380 s of training (the default time budget; train.max_updates=N replaces it)"``, ..."""
    parts = []
    if train.max_updates > 0:
        parts.append(f"train.max_updates={train.max_updates}")
    if train.max_epochs > 0:
        parts.append(f"train.max_epochs={train.max_epochs}")
    seconds = time_budget(train)
    if seconds > 0:
        parts.append(
            f"train.max_time={seconds:g}s"
            if train.max_time is not None
            else f"{seconds:g} s of training (the default time budget; train.max_updates=N replaces it)"
        )
    if train.patience > 0:
        parts.append(f"train.patience={train.patience} validations without improvement")
    return ", or ".join(parts) + (" (whichever comes first)" if len(parts) > 1 else "")


RESUME_MODES = (False, True, "auto")
"""The values of ``train.resume``."""


def resume_mode(value: Any) -> bool | str:
    """``train.resume`` as one of :data:`RESUME_MODES` (bools and ``"true"``/``"false"`` alike).

    Raises:
        ValueError: any other value.
    """
    text = str(value).strip().lower()
    if text in ("true", "false", "auto"):
        return {"true": True, "false": False}.get(text, "auto")
    raise ValueError(f"train.resume={value!r} is not one of false, true, auto")


def hydra_subdir(resume: Any = False, resume_from: Any = None, output_dir: Any = None) -> str | None:
    """Where Hydra records a training job (the ``zoo.hydra_subdir`` resolver): ``.hydra`` for a new run,
    ``.hydra/resume-<date>_<time>`` for a resume (``train.resume=true|auto`` with a ``checkpoint_last``
    in ``output_dir``), None when another process holds the folder."""
    if str(resume_from or "").lower() not in ("", "none", "null"):
        resuming = True
    else:
        try:
            mode = resume_mode(resume)
        except ValueError:
            mode = False  # validate_config reports it, with the other fields
        resuming = bool(mode)
        if resuming and str(output_dir or "").lower() not in ("", "none", "null"):
            # the run folder's checkpoint_last (transformer/runs/folder.py: the layout's one home)
            resuming = has_checkpoint(str(output_dir))
    return record_subdir(resuming, output_dir)


def swept_keys(overrides: Sequence[str]) -> list[str]:
    """The keys a multirun's overrides sweep (``a=1,2``, ``seed=range(1,4)``, ``model/ffn=relu,swiglu``),
    Hydra's own left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("-")])
    except Exception:  # a command line Hydra refuses: Hydra says why
        return []
    keys = []
    for override in parsed:
        key = override.key_or_group
        if override.is_sweep_override() and not key.startswith("hydra") and key not in keys:
            keys.append(key)
    return keys


def swept_suffix(task_overrides: Iterable[Any] | None = None, *named: str) -> str:
    """``_<key>=<value>`` for each swept key (:data:`SWEPT_KEYS_ENV`) the folder name does not show
    (``named``); ``""`` outside a multirun. Keys are shortened to their last part unless two share it,
    and the text is filesystem-safe."""
    keys = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k and k not in named]
    if not keys:
        return ""
    values = {}
    for item in task_overrides or []:
        key, _, value = str(item).partition("=")
        key = key.lstrip("+~")
        if key in keys:
            values[key] = value
    tails = [k.replace("/", ".").rsplit(".", 1)[-1] for k in keys]
    parts = []
    for key, tail in zip(keys, tails):
        if key in values:
            shown = tail if tails.count(tail) == 1 else key
            parts.append(f"_{shown}={values[key]}")
    return re.sub(r"[\s'\"/\\]+", "-", "".join(parts))


_TOP_LEVEL_VALUES = {name for name, hint in get_type_hints(Config).items() if not dataclasses.is_dataclass(hint)}
"""The top-level fields of the config that hold a value (``seed``, ``experiment_name``, ...), not a
group's node: every other swept key without a dot is a config group."""


def _shown(key: str, value: str, keys: Sequence[str]) -> str:
    """A swept value in a folder name: a group option as it is (``rope``), ``seed<value>``, else
    ``<last part>=<value>`` (the whole key where two share the last part)."""
    if key == "seed":
        return f"seed{value}"
    if "." not in key and key not in _TOP_LEVEL_VALUES:  # a config group (model/ffn, ladder, optim)
        return value
    tails = [k.replace("/", ".").rsplit(".", 1)[-1] for k in keys]
    tail = key.replace("/", ".").rsplit(".", 1)[-1]
    return f"{tail if tails.count(tail) == 1 else key}={value}"


def sweep_subdir(task_overrides: Iterable[Any] | None = None, job_num: Any = 0, sweeper: Any = "basic") -> str:
    """A multirun job's folder name (``hydra.sweep.subdir``): the swept values joined by ``_``
    (``-m model/ffn=relu,swiglu seed=1,2`` -> ``relu_seed1``, ...), so a re-run finds each job's folder;
    the job number when nothing is swept on the command line or a search samples the values."""
    keys = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k]
    values: dict[str, str] = {}
    for item in task_overrides or []:
        key, _, value = str(item).partition("=")
        values[key.lstrip("+~")] = value
    if str(sweeper) != "basic" or not keys or any(k not in values for k in keys):
        return str(job_num)
    name = "_".join(_shown(k, values[k], keys) for k in keys)
    return re.sub(r"[\s'\"/\\]+", "-", name)


if not OmegaConf.has_resolver("zoo.sweep_subdir"):
    OmegaConf.register_new_resolver("zoo.sweep_subdir", sweep_subdir)
if not OmegaConf.has_resolver("zoo.swept"):
    OmegaConf.register_new_resolver("zoo.swept", swept_suffix)
if not OmegaConf.has_resolver("zoo.hydra_subdir"):  # at import: jobs unpickled on a cluster node have it too
    OmegaConf.register_new_resolver("zoo.hydra_subdir", hydra_subdir, use_cache=True)
