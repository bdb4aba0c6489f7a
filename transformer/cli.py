"""What the command-line scripts share before Hydra starts.

Hydra resolves ``hydra/launcher=...`` and ``hydra/sweeper=...`` itself and, when the plugin's
distribution is not installed, stops with "Could not find 'hydra/launcher/submitit_slurm'" and a
list of the options it has. :func:`check_hydra_plugins` reads the command line first and names the
``pip install`` that provides the plugin instead.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Sequence

__all__ = ["HYDRA_PLUGINS", "MissingPlugin", "check_hydra_plugins"]

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
