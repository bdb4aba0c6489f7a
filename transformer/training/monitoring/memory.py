"""Peak memory per phase of a run (training, validation, test), for sizing parallel jobs.

On Linux the kernel keeps the process's peak resident set (``VmHWM`` in ``/proc/self/status``)
and resets it when ``5`` is written to ``/proc/self/clear_refs`` (Linux >= 4.0). A
:class:`PhaseMemory` reads the peak and resets it at every change of phase, so each phase gets the
highest RSS reached while it ran. On CUDA it does the same with
``torch.cuda.max_memory_allocated`` / ``reset_peak_memory_stats`` (tensor memory). Where neither
is available the process-wide peak (``getrusage``) is attributed to the phase that was running.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

__all__ = ["PHASES", "PhaseMemory"]

PHASES = ("training", "validation", "test")

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _rss_peak_mb() -> float | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def _reset_rss_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class PhaseMemory:
    """Highest memory seen in each phase (MiB).

    Args:
        device: the training device (CUDA: tensor memory; else the process's resident set).

    Call :meth:`enter` when a phase starts (``"training"``, ``"validation"``, ``"test"``); the
    memory of the phase that was running is recorded first. :attr:`peaks` holds the results.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.peaks: dict[str, float] = {}
        self.current: str | None = None
        self._resettable = self.cuda or _reset_rss_peak()

    def _read(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        peak = _rss_peak_mb() if self._resettable else None
        return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def _reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._resettable:
            _reset_rss_peak()

    def enter(self, phase: str | None) -> None:
        """Record the running phase's peak, reset the peak, and start ``phase`` (None: stop)."""
        if self.current is not None:
            self.peaks[self.current] = max(self.peaks.get(self.current, 0.0), self._read())
        self._reset()
        self.current = phase

    def as_dict(self) -> dict[str, float]:
        """``{phase: peak MiB}`` of the phases seen so far, the running one included."""
        out = dict(self.peaks)
        if self.current is not None:
            out[self.current] = max(out.get(self.current, 0.0), self._read())
        return {p: round(out[p], 1) for p in PHASES if p in out} | {
            p: round(v, 1) for p, v in out.items() if p not in PHASES
        }
