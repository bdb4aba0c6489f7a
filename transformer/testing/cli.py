"""The kit's command line: ``python -m transformer.testing`` (:func:`main`)."""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import OmegaConf

from transformer.config import GROUPS
from transformer.plugins import ORIGINS, PluginError, import_plugins
from transformer.testing.checks import CHECKS, check_model
from transformer.testing.models import ARCHS, tiny_model
from transformer.testing.schedules import check_schedule

__all__ = ["CHECKED", "MODULES", "main"]

MODULES = ("model/attention", "model/ffn", "model/norm", "model/position")
"""The groups whose options are modules the kit checks on their own (the others, e.g. a RoPE
scaling, are checked with the option they belong to: ``model/position=rope`` and its fields)."""

CHECKED = (*MODULES, "lr_scheduler")
"""The groups whose options the command checks when a plugin is named without an option:
the modules' (:data:`MODULES`, :func:`check_model`) and the schedules (:func:`check_schedule`)."""


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer.testing [plugins=[...]] [<group>=<option> ...] [model.<field>=<value> ...]
    [lr_scheduler.<field>=<value> ...] [train.max_updates=N]``: every check on both families (a
    schedule: :func:`check_schedule`); prints one line per family (per schedule) and exits 1 on the
    first failure, 2 on a bad argument or plugin. Without ``<group>=<option>``, every option of the
    groups of :data:`CHECKED` the named plugins registered is checked in turn (with its default fields)."""
    args = list(sys.argv[1:] if argv is None else argv)
    plugins: list[str] = []
    options: dict[str, str] = {}
    fields: dict[str, Any] = {}
    schedule: dict[str, Any] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            print(f"error: {arg}: expected <group>=<option> or model.<field>=<value>", file=sys.stderr)
            return 2
        if key == "plugins":
            plugins = [p.strip() for p in value.strip("[]").split(",") if p.strip()]
        elif key in GROUPS:
            options[key] = value
        elif key.startswith("model."):
            fields[key[len("model.") :]] = OmegaConf.from_dotlist([f"v={value}"]).v
        elif key.startswith("lr_scheduler.") or key == "train.max_updates":
            schedule[key.removeprefix("lr_scheduler.").removeprefix("train.")] = OmegaConf.from_dotlist(
                [f"v={value}"]
            ).v
        else:
            print(
                f"error: {arg}: expected <group>=<option> ({', '.join(GROUPS)}), model.<field>=<value>, "
                "lr_scheduler.<field>=<value> or train.max_updates=<n>",
                file=sys.stderr,
            )
            return 2
    try:
        loaded = {p.name for p in import_plugins(plugins)}
        runs = [options] if options else []
        if not options:
            runs = [
                {switch: name} for (switch, name), owner in ORIGINS.items() if owner in loaded and switch in CHECKED
            ]
            if not runs:
                raise ValueError(
                    "name the option to check, e.g. model/attention=diff ("
                    + (
                        f"the plugins {', '.join(sorted(loaded))} register no option of {', '.join(CHECKED)})"
                        if loaded
                        else f"a group of {', '.join(GROUPS)})"
                    )
                )
        for chosen in runs:
            chosen = dict(chosen)
            if "lr_scheduler" in chosen:
                name = chosen.pop("lr_scheduler")
                check_schedule(name, **schedule)
                print(f"lr_scheduler={name}: finite rates >= 0, a rising warmup, a pure function: passed")
            elif schedule:
                raise ValueError(
                    f"{', '.join(f'lr_scheduler.{k}' for k in schedule)}: name the schedule, e.g. lr_scheduler=cosine"
                )
            if not chosen and fields:
                raise ValueError("model.* fields given without a model option; name one, e.g. model/norm=rmsnorm")
            if not chosen:
                continue
            for arch in ARCHS:
                model, _ = tiny_model(arch, chosen, **fields)
                check_model(model)
                print(f"{arch}: {', '.join(CHECKS)} passed ({', '.join(f'{k}={v}' for k, v in chosen.items())})")
    except (PluginError, ValueError) as err:
        print("error: " + " ".join(str(err).split()), file=sys.stderr)  # one line, whatever raised it
        return 2
    except AssertionError as err:
        print(f"failed: {err}", file=sys.stderr)
        return 1
    return 0
