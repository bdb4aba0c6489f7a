"""What the command-line scripts share: checks before Hydra starts, and the sweep objective.

Hydra resolves ``hydra/launcher=...`` and ``hydra/sweeper=...`` itself and, when the plugin's
distribution is not installed, stops with "Could not find 'hydra/launcher/submitit_slurm'" and a
list of the options it has. :func:`check_hydra_plugins` reads the command line first and names the
``pip install`` that provides the plugin instead.

A Hydra sweeper (``hydra/sweeper=optuna``) optimises what the task function returns:
``scripts/train.py`` returns :func:`sweep_objective`, the best validation metric, and checks the
sweeper's direction against ``train.best_metric`` before training (:func:`check_sweep_objective`).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Sequence

__all__ = ["HYDRA_PLUGINS", "MissingPlugin", "check_hydra_plugins", "check_sweep_objective", "sweep_objective",
           "sweeper_direction"]

HYDRA_PLUGINS: dict[tuple[str, str], tuple[str, str, str]] = {
    # (group, option): (module that registers it, distribution, this project's extra)
    ("launcher", "submitit_local"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    ("launcher", "submitit_slurm"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    ("launcher", "joblib"): ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher", "sweep"),
    ("sweeper", "optuna"): ("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper", "sweep"),
}
"""The Hydra plugins this project documents, the module each registers and where it comes from."""

_OVERRIDE = re.compile(r"^[~+]*hydra/(launcher|sweeper)=([A-Za-z0-9_]+)$")


class MissingPlugin(RuntimeError):
    """A Hydra plugin named on the command line is not installed (the message names the ``pip install``)."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_hydra_plugins(argv: Sequence[str]) -> None:
    """Refuse a command line whose ``hydra/launcher=`` or ``hydra/sweeper=`` plugin is missing.

    Args:
        argv: the script's arguments (``sys.argv[1:]``).

    Raises:
        MissingPlugin: naming the option, the distribution and the ``pip install`` that provides it.
    """
    for arg in argv:
        match = _OVERRIDE.match(arg)
        if not match or (match.group(1), match.group(2)) not in HYDRA_PLUGINS:
            continue
        module, dist, extra = HYDRA_PLUGINS[(match.group(1), match.group(2))]
        if not _installed(module):
            raise MissingPlugin(
                f"hydra/{match.group(1)}={match.group(2)} needs the {dist} package, which is not installed: "
                f"pip install -e \".[{extra}]\" (or pip install {dist})"
            )


def sweeper_direction() -> str | list | None:
    """``hydra.sweeper.direction`` of the running Hydra job when its sweeper has one (Optuna's), else None."""
    try:
        from hydra.core.hydra_config import HydraConfig

        sweeper = HydraConfig.get().sweeper
    except Exception:  # not under Hydra
        return None
    direction = sweeper.get("direction") if hasattr(sweeper, "get") else None
    return None if direction is None else (list(direction) if not isinstance(direction, str) else str(direction))


def check_sweep_objective(train_cfg, direction: str | list | None) -> None:
    """A sweeper that optimises the run's return value (:func:`sweep_objective`) must optimise it
    the right way: ``maximize`` for ``train.best_metric=bleu``, ``minimize`` for ``loss``.

    Raises:
        ValueError: naming ``hydra.sweeper.direction`` and ``train.best_metric`` (or ``train.valid_bleu``).
    """
    if direction is None:
        return
    if not isinstance(direction, str):
        raise ValueError(f"hydra.sweeper.direction={direction}: scripts/train.py returns one objective "
                         "(the best validation train.best_metric); give one direction")
    want = "maximize" if train_cfg.best_metric == "bleu" else "minimize"
    if direction.lower() != want:
        raise ValueError(f"hydra.sweeper.direction={direction} but train.best_metric={train_cfg.best_metric} "
                         f"(the objective each trial returns) is optimised by {want}")
    if train_cfg.best_metric == "bleu" and not train_cfg.valid_bleu:
        raise ValueError("train.best_metric=bleu is the sweep's objective, but train.valid_bleu=false computes no "
                         "validation BLEU; set train.valid_bleu=true or train.best_metric=loss")


def sweep_objective(results: dict) -> float | None:
    """What ``scripts/train.py`` returns to a Hydra sweeper: the run's best **validation**
    ``train.best_metric`` (``results["best_valid"]``), never a test score; None when the run has
    none (a sweeper then records the trial as failed)."""
    value = results.get("best_valid")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
