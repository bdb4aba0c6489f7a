"""A torchrun worker: ``scripts/train.py`` as it runs, with probes, for the multi-rank tests.

    python -m torch.distributed.run --nproc_per_node=2 tests/training/rank_probe.py OVERRIDES...

Environment:

* ``PROBE_OUT``: a folder; each rank writes ``rank<r>.json`` there when it ends (also on an error).
* ``PROBE_RANK``: the rank the next two act on.
* ``PROBE_CLOCK_RATE``: that rank's clock (``time.time``, ``monotonic``, ``perf_counter``) runs
  this many times faster than the others' (clocks that disagree).
* ``PROBE_STEP_SLEEP``: that rank sleeps this many seconds in every update (a slower rank).
* ``PROBE_COMPILE_BACKEND``: the ``torch.compile`` backend of ``train.compile=true`` on every rank
  (default: the project's, inductor; ``eager`` checks dynamo's graphs without generating code).

What each rank records, by update: the ``torch.distributed`` calls made (``origin`` ``gradients``
for the engines' own gradient traffic made from Python: a DDP communication hook, FSDP2's
internals (DDP's own C++ all-reduce is not seen); else the first
project frame, ``file:function``), and the host reads (``.item()``, ``.tolist()``, ``bool``,
``int``, ``float`` of a tensor) that project code makes outside ``Trainer.train_step``. An event
belongs to update ``u`` when it happens inside the step that makes update ``u`` or after it, before
the next step starts. ``stopped_at`` is the trainer's update count when the process ends.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from transformer.training.step import compiled

ROOT = Path(__file__).resolve().parents[2]
PROJECT = str(ROOT / "transformer")
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "barrier",
    "reduce",
    "scatter",
    "all_to_all_single",
)
READS = ("item", "tolist", "__bool__", "__int__", "__float__")
ENGINE_FRAMES = (f"{os.sep}ddp_comm_hooks{os.sep}", f"{os.sep}fsdp{os.sep}", f"{os.sep}_composable{os.sep}")

state: dict[str, Any] = {"trainer": None, "in_step": False}
events: dict[int, dict[str, list[str]]] = defaultdict(lambda: {"collectives": [], "reads": []})


def _update() -> int:
    trainer = state["trainer"]
    if trainer is None:
        return 0
    return trainer.update + (1 if state["in_step"] else 0)


def _origin(engine_check: bool) -> str | None:
    frame = sys._getframe(2)
    first = None
    while frame is not None:
        name = frame.f_code.co_filename
        if engine_check and any(s in name for s in ENGINE_FRAMES):
            return "gradients"
        if first is None and name.startswith(PROJECT):
            first = f"{Path(name).relative_to(ROOT)}:{frame.f_code.co_name}"
            if not engine_check:
                return first
        frame = frame.f_back
    return first


def _wrap_collective(name: str) -> None:
    original = getattr(dist, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        events[_update()]["collectives"].append(f"{name} {_origin(engine_check=True)}")
        return original(*args, **kwargs)

    setattr(dist, name, counted)
    setattr(dist.distributed_c10d, name, counted)


def _wrap_read(name: str) -> None:
    original = getattr(torch.Tensor, name)

    def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if state["trainer"] is not None and not state["in_step"]:
            origin = _origin(engine_check=False)
            if origin is not None:
                events[_update()]["reads"].append(f"{name} {origin}")
        return original(self, *args, **kwargs)

    setattr(torch.Tensor, name, counted)


def _speed_up_clock(rate: float) -> None:
    for name in ("time", "monotonic", "perf_counter"):
        real = getattr(time, name)
        start = real()
        setattr(time, name, lambda real=real, start=start: start + (real() - start) * rate)


def _watch_steps(sleep: float) -> None:
    from transformer.training.loop.trainer import Trainer

    original = Trainer.train_step

    def train_step(self: Trainer, batches: list, ntokens: int | None = None) -> dict[str, Any]:
        state["trainer"], state["in_step"] = self, True
        try:
            if sleep:
                time.sleep(sleep)
            return original(self, batches, ntokens)
        finally:
            state["in_step"] = False

    Trainer.train_step = train_step


def main() -> None:
    rank = int(os.environ["RANK"])
    probed = rank == int(os.environ.get("PROBE_RANK", "-1"))
    if probed and float(os.environ.get("PROBE_CLOCK_RATE", "1")) != 1:
        _speed_up_clock(float(os.environ["PROBE_CLOCK_RATE"]))
    _watch_steps(float(os.environ.get("PROBE_STEP_SLEEP", "0")) if probed else 0.0)
    if os.environ.get("PROBE_COMPILE_BACKEND"):
        compiled.BACKEND = os.environ["PROBE_COMPILE_BACKEND"]
    for name in COLLECTIVES:
        _wrap_collective(name)
    for name in READS:
        _wrap_read(name)
    sys.argv = [str(ROOT / "scripts" / "train.py"), *sys.argv[1:]]
    error = None
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exit_:
        error = None if exit_.code in (0, None) else f"exit {exit_.code}"
        raise
    except BaseException:
        error = traceback.format_exc()
        raise
    finally:
        trainer = state["trainer"]
        record = {
            "rank": rank,
            "stopped_at": None if trainer is None else trainer.update,
            "error": error,
            "updates": {str(u): e for u, e in sorted(events.items())},
        }
        out = Path(os.environ["PROBE_OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
