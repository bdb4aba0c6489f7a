"""Resuming a run without ever damaging it.

``train.resume=true`` continues the run in the run folder from its ``checkpoint_last`` (and starts
it when the folder holds no checkpoint); ``train.resume=auto`` does the same and leaves a run that
is already complete as it is (:func:`completed_results`), so one command re-run after any
interruption continues every unfinished run of a sweep and skips the finished ones;
``train.resume_from=PATH`` continues from any checkpoint (e.g. a numbered one when
``checkpoint_last`` is damaged). Either way:

* the run continues with **its own saved config** (the ``config`` stored in the checkpoint's
  training state), whatever the command line's defaults are now;
* the command line may change only the fields of :data:`RESUME_OVERRIDES` (when to stop, what to
  show, where the run and its data are); naming any other field with a different value is a
  :class:`~transformer.config.ConfigError` that lists them;
* everything is checked (the checkpoint read, the config compared) before anything in the run
  folder is written; a checkpoint that cannot be read names the other checkpoints of the folder
  and how to resume from one.

Under Hydra, "named on the command line" means: set by one of the job's overrides (a group
override such as ``model/position=rope`` names every field under ``model.position``) or changed
by them from the config's defaults; a group override that repeats the run's recorded choice
(``.hydra/hydra.yaml``) names nothing, so repeating the original command line always works.
Outside Hydra (tests, notebooks) every field of the given config counts as named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer.config import (
    Config,
    ConfigError,
    config_differences,
    keys_with,
    resume_mode,
    typed_config,
    validate_config,
)
from transformer.runs.folder import checkpoint_stem, has_checkpoint
from transformer.runs.hydra_record import recorded_choices
from transformer.training.checkpoint import CheckpointError, CheckpointManager, load_checkpoint, numbered_checkpoints

__all__ = [
    "BUDGET_FIELDS",
    "RESUME_OVERRIDES",
    "ResumePoint",
    "checkpoint_names",
    "command_line_fields",
    "completed_results",
    "prepare_resume",
    "resume_config",
]

RESUME_OVERRIDES: tuple[str, ...] = keys_with(Config, resume=("free", "always"))
"""Fields a resumed run may take from the command line (a name covers the fields under it): those
whose rule, declared at the field in :mod:`transformer.config.schema`, says ``resume="free"`` (when to
stop, what to show, the machine, how it computes, where the run, its data and its plugins are) or
``"always"`` (:mod:`transformer.config.rules`)."""

_ALWAYS_FROM_COMMAND_LINE: tuple[str, ...] = keys_with(Config, resume=("always",))
"""Fields a resumed run takes from the command line, named or not (what to resume, and where)."""


@dataclass
class ResumePoint:
    """A checkpoint to continue from, read and checked.

    Attributes:
        stem: the checkpoint (``dir / "checkpoint_last"``).
        cfg: the config the run continues with (its saved config plus the allowed overrides).
        model_state: the weights.
        train_state: the training state (optimizer, scheduler, RNG, sampler, counters, config).
    """

    stem: Path
    cfg: DictConfig
    model_state: dict[str, torch.Tensor]
    train_state: dict[str, Any]

    @property
    def update(self) -> int:
        """The number of updates the checkpoint had done."""
        return int(self.train_state.get("update", 0))


def _covered(key: str, names: tuple[str, ...] | set[str]) -> bool:
    return any(key == n or key.startswith(n + ".") for n in names)


def checkpoint_names(folder: Path) -> list[str]:
    """Names of the loadable-looking checkpoints of ``folder``: numbered (oldest first), best, last."""
    names = [p.name for p in numbered_checkpoints(folder)]
    names += [n for n in (CheckpointManager.BEST, CheckpointManager.LAST) if has_checkpoint(folder, n)]
    return names


def _hint(folder: Path, exclude: str | None = None) -> str:
    others = [n for n in checkpoint_names(folder) if n != exclude]
    if not others:
        return f"{folder} holds no other checkpoint"
    pick = next((n for n in reversed(others) if n.split("_")[-1].isdigit()), others[-1])
    return f"{folder} also holds {', '.join(others)}: continue from one of them with train.resume_from={folder / pick}"


def resume_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The checkpoint a run continues from, or None to start from scratch.

    Args:
        cfg: the command line's config (``train.resume``, ``train.resume_from``).
        run_dir: the run folder.

    Returns:
        The checkpoint stem: ``train.resume_from`` when set, else ``run_dir / "checkpoint_last"``
        with ``train.resume=true``; None when not resuming, or when resuming a folder without any
        checkpoint (a run that never saved).

    Raises:
        CheckpointError: ``train.resume_from`` names no checkpoint, or ``run_dir`` has checkpoints
            but no ``checkpoint_last`` (the message lists them and how to continue from one).
    """
    t = cfg.train
    if t.get("resume_from"):
        p = Path(str(t.resume_from)).expanduser()
        stem = checkpoint_stem(p)
        if not has_checkpoint(stem.parent, stem.name):
            raise CheckpointError(
                f"train.resume_from={t.resume_from}: there is no {stem}.safetensors; {_hint(stem.parent)}"
            )
        return stem
    mode = resume_mode(t.resume)
    if not mode:
        return None
    last = run_dir / CheckpointManager.LAST
    if has_checkpoint(run_dir, last.name):
        return last
    if checkpoint_names(run_dir):
        raise CheckpointError(f"train.resume={str(mode).lower()} but {run_dir} has no {last.name}; {_hint(run_dir)}")
    return None


BUDGET_FIELDS: tuple[str, ...] = ("max_updates", "max_epochs", "max_time", "patience")
"""The ``train`` fields that say when a run is done: a complete run resumed with a larger budget trains on."""


def completed_results(run_dir: Path, resume: ResumePoint) -> dict[str, Any] | None:
    """The run's ``results.json`` when the run is complete (what ``train.resume=auto`` leaves alone).

    A run is complete when its folder holds a readable ``results.json`` written after training
    the updates of its ``checkpoint_last`` (``results["updates"]`` equals the checkpoint's update)
    under the budget the resumed config has (:data:`BUDGET_FIELDS` of ``train`` unchanged: a resume
    with ``train.max_updates`` raised is not complete, it trains on).

    Args:
        run_dir: the run folder.
        resume: the checked checkpoint the run would continue from.

    Returns:
        The results record, or None when the run must go on (or test again).
    """
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(results, dict) or results.get("updates") != resume.update:
        return None
    ran = (results.get("config") or {}).get("train") or {}
    now = resume.cfg.train
    if any(name not in ran or ran[name] != now[name] for name in BUDGET_FIELDS):
        return None
    return results


def command_line_fields(cfg: DictConfig, run_choices: dict[str, str] | None = None) -> tuple[set[str], set[str]] | None:
    """What the command line of this Hydra job names: ``(override prefixes, changed fields)``.

    A group override that repeats the run's own choice (``experiment=wu2021_tiny`` on a run started
    with it) names nothing: the run keeps the values it was trained with, even if that group's file
    has changed since.

    Args:
        cfg: the job's config (composed with the command line's overrides).
        run_choices: the run's recorded group choices (``.hydra/hydra.yaml``), or None.

    Returns:
        The dotted prefixes of the job's other overrides (``model/position=rope`` ->
        ``model.position``) and the fields those overrides change from the config composed without
        any override; None outside Hydra.
    """
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except Exception:  # not under Hydra
        return None
    groups = set(hc.runtime.choices)
    kept = []
    for o in (str(o) for o in hc.overrides.task):
        key, _, value = o.partition("=")
        key = key.lstrip("~+").split("@", 1)[0]
        if key in groups and run_choices is not None and run_choices.get(key) == value:
            continue  # the run's own choice, repeated
        kept.append((o, key.replace("/", ".")))
    prefixes = {prefix for _, prefix in kept}
    changed: set[str] = set()
    try:
        from hydra import compose

        base = compose(config_name=hc.job.config_name, overrides=[])
        named = (
            compose(config_name=hc.job.config_name, overrides=[o for o, _ in kept])
            if len(kept) < len(hc.overrides.task)
            else cfg
        )
        changed = {k for k, _, _ in config_differences(_plain(base), _plain(named))}
    except Exception:  # composing again failed: the override names alone decide
        pass
    return prefixes, changed


def _plain(cfg: Any) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    container.pop("hydra", None)
    return container


def resume_config(cfg: DictConfig, saved: dict[str, Any], named: tuple[set[str], set[str]] | None) -> DictConfig:
    """The config a resumed run continues with: ``saved`` plus the allowed command-line changes.

    Args:
        cfg: the command line's config.
        saved: the run's saved config (plain dict, as stored in the checkpoint).
        named: :func:`command_line_fields` (None: every field of ``cfg`` counts as named).

    Returns:
        A validated config: ``saved`` where the command line names nothing or names the same
        value, the command line's value for named fields of :data:`RESUME_OVERRIDES` (and always
        for ``train.resume``, ``train.resume_from`` and ``run_dir``).

    Raises:
        ConfigError: the command line names other fields with other values (the message lists
            them with both values and says which fields may change), or ``saved`` does not fit
            this version's :class:`~transformer.config.Config`.
    """
    try:
        run_cfg = typed_config(saved)  # a run saved in an older shape continues in this version's
    except ConfigError as err:
        raise ConfigError(f"the run's saved config {err}") from None

    def is_named(key: str) -> bool:
        return named is None or _covered(key, named[0]) or key in named[1]

    blocked, take = [], []
    for key, old, new in config_differences(_plain(run_cfg), _plain(cfg)):
        if key == "train.pad_to_multiple" and new == "auto":
            continue  # auto resolved to the run's number when it started (job/run.py, _resolve_auto_batching)
        if _covered(key, _ALWAYS_FROM_COMMAND_LINE) or (_covered(key, RESUME_OVERRIDES) and is_named(key)):
            take.append((key, new))
        elif is_named(key):
            blocked.append(f"{key} ({old!r} in the run, {new!r} on the command line)")
    if blocked:
        raise ConfigError(
            f"a resumed run continues with its own config, but the command line changes {'; '.join(blocked[:8])}"
            f"{' and more' if len(blocked) > 8 else ''}. On resume only {', '.join(RESUME_OVERRIDES)} may "
            "change; drop the others from the command line, or train a new run in another folder"
        )
    for key, value in take:
        OmegaConf.update(run_cfg, key, value, merge=False)
    validate_config(run_cfg)
    return run_cfg


def prepare_resume(cfg: DictConfig, run_dir: Path, device: torch.device) -> ResumePoint | None:
    """Find, read and check the checkpoint a run continues from; nothing is written.

    Args:
        cfg: the command line's (validated) config.
        run_dir: the run folder.
        device: where the tensors go.

    Returns:
        The :class:`ResumePoint`, or None when the run starts from scratch.

    Raises:
        CheckpointError: the checkpoint is missing or cannot be read (the message lists the other
            checkpoints of its folder and ``train.resume_from``).
        ConfigError: see :func:`resume_config`.
    """
    stem = resume_checkpoint(cfg, run_dir)
    if stem is None:
        return None
    try:
        model_state, state = load_checkpoint(stem.parent, stem.name, map_location=device)
    except (CheckpointError, FileNotFoundError) as err:
        raise CheckpointError(f"cannot resume from {stem}: {err}. {_hint(stem.parent, exclude=stem.name)}") from err
    saved = state.get("config")
    named = command_line_fields(cfg, recorded_choices(stem.parent))
    try:
        run_cfg = resume_config(cfg, saved, named) if isinstance(saved, dict) else cfg
    except ConfigError as err:
        raise ConfigError(
            f"{run_dir} holds a run trained with another config: {err}; to start a new run choose another "
            "folder (hydra.run.dir=..., or in a sweep hydra.sweep.subdir=... naming the swept keys)"
        ) from None
    return ResumePoint(stem=stem, cfg=run_cfg, model_state=model_state, train_state=state)
