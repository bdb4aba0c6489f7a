"""A run's counters and its clocks: updates, target tokens, training seconds and wall seconds."""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["TrainState"]


class TrainState:
    """Updates and target tokens trained so far, and the run's two clocks.

    Training time is wall time between the points where the ranks meet (:meth:`tick`), without
    validating and saving, so it counts the device's queued work; under torchrun the ranks then
    agree on one value (the slowest's). Wall time adds this process's seconds to those of the
    run's earlier processes (until their last save).
    """

    def __init__(self) -> None:
        self.update = 0
        self.train_tokens = 0  # all ranks, counted on the host
        self.train_time = 0.0  # seconds, at the ranks' last meeting
        self.wall_time_before = 0.0  # seconds of the earlier processes of this run
        self.started = time.time()
        self._clock_start = time.time()  # since when training time runs and is not yet in train_time

    def running_time(self) -> float:
        """Training seconds now: :attr:`train_time` and the time since the last meeting."""
        return self.train_time + (time.time() - self._clock_start)

    def tick(self, device: torch.device) -> None:
        """Add the time since the last meeting (the device's queued work included) to :attr:`train_time`."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        now = time.time()
        self.train_time += now - self._clock_start
        self._clock_start = now

    def restart_clock(self) -> None:
        """Training time runs again from now (after validating or saving)."""
        self._clock_start = time.time()

    def wall_time(self) -> float:
        """Wall seconds of the whole run: its earlier processes and this one."""
        return self.wall_time_before + (time.time() - self.started)

    def state_dict(self) -> dict[str, Any]:
        """``{"update", "train_tokens", "train_time", "wall_time"}``, as a checkpoint holds them."""
        return {
            "update": self.update,
            "train_tokens": self.train_tokens,
            "train_time": self.train_time,
            "wall_time": self.wall_time(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a checkpoint's counters (one without ``wall_time`` counts 0 earlier seconds)."""
        self.update, self.train_tokens = int(state["update"]), int(state["train_tokens"])
        self.train_time = float(state["train_time"])
        self.wall_time_before = float(state.get("wall_time", 0.0))
