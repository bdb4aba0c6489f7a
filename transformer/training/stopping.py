"""A polite stop: a signal ends training at the next update boundary with its state saved.

Clusters ask a job to stop before they kill it: SLURM sends SIGTERM at its time limit, on
preemption and on ``scancel`` (then SIGKILL after ``KillWait``), or the signal named by
``--signal`` (e.g. ``--signal=TERM@180``) ahead of the limit; submitit's preemption signal is USR2
(``SUBMITIT_PREEMPT_SIGNAL``). PyTorch Lightning, NeMo and submitit's checkpoint protocol save on
such a signal; so does this project.

:class:`GracefulStop` installs a handler for each of ``train.stop_signals`` that only records the
signal. One process looks at it after every update; under torchrun the ranks exchange it where
they meet anyway, at the updates they log, validate or save (one rank receiving the signal is
enough, see :meth:`~transformer.training.distributed.parallel.DataParallel.agree`), so the run stops
within ``train.log_every`` updates. The trainer finishes the update in progress (and the validation
in progress, if one is running), saves
``checkpoint_last`` (atomically, as every save) and raises :class:`StopRequested`. The run then
logs where it stopped and how to continue, and ends with exit status :data:`STOP_EXIT_STATUS`.
Further signals while it stops are logged and ignored (a second SIGINT, a user's impatient Ctrl-C,
interrupts at once; the atomic save still leaves the previous checkpoint intact). When the signal
had a Python handler before (submitit's preemption handler, which checkpoints the job and requeues
it), that handler is called after the save (:meth:`GracefulStop.hand_over`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformer.config import signal_number, time_budget

__all__ = ["STOP_EXIT_STATUS", "Due", "GracefulStop", "StopRequested", "budget_reached", "due_at", "signal_stop"]

STOP_EXIT_STATUS = 75
"""Exit status of a run stopped by a signal after saving (``EX_TEMPFAIL``: not finished, run again to continue)."""


class StopRequested(Exception):
    """Training stopped on a signal after saving ``checkpoint_last`` (not an error: run again to continue).

    Attributes:
        signal_name: the signal (``SIGTERM``).
        update: the last update trained (and saved).
        exit_status: :data:`STOP_EXIT_STATUS`.
    """

    exit_status = STOP_EXIT_STATUS

    def __init__(self, signal_name: str, update: int, message: str) -> None:
        super().__init__(message)
        self.signal_name, self.update = signal_name, update


class GracefulStop:
    """Records the first of ``signals`` received; a context manager installing and restoring handlers.

    Args:
        signals: signal names (see :func:`~transformer.config.signal_number`).
        announce: write a line to stderr when a signal arrives (rank 0).

    Handlers can only be installed from the main thread; elsewhere (a thread-pool job) nothing is
    installed and :attr:`received` stays None.
    """

    def __init__(self, signals: Sequence[str], announce: bool = True) -> None:
        self.signals = [signal_number(s) for s in signals]
        self.announce = announce
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}  # installed over, restored on exit
        self._handed: dict[signal.Signals, Any] = {}  # the same, kept for hand_over after exit

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._handed = dict(self._previous)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        # os.write, not print: a handler that writes to a buffered stream the interrupted code was
        # writing to fails with "reentrant call"
        sig = signal.Signals(signum)
        if self.received is None:
            self.received = sig
            self._say(f"received {sig.name}: stopping after the update in progress, with checkpoint_last saved")
        elif sig == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once (the last complete save stays intact)
        else:
            self._say(f"received {sig.name} while stopping: ignored, the save in progress goes on")

    def _say(self, message: str) -> None:
        if self.announce:
            try:
                os.write(2, (message + "\n").encode())
            except OSError:
                pass

    @property
    def requested(self) -> bool:
        """Whether a stop signal has arrived."""
        return self.received is not None

    def hand_over(self) -> None:
        """Call the handler the received signal had before (e.g. submitit's checkpoint-and-requeue,
        which may exit the process); nothing when it had none or a default one."""
        previous = self._handed.get(self.received) if self.received is not None else None
        if callable(previous) and previous not in (signal.default_int_handler,):
            previous(int(self.received), None)


def budget_reached(train: Any, *, update: int, epochs_done: int, train_time: float, bad_validations: int) -> str | None:
    """Why training stops now (a sentence naming the ``train.*`` limit reached), or None.

    Args:
        train: the ``train`` config (``max_updates``, ``max_epochs``, ``max_time`` through
            :func:`~transformer.config.time_budget`, ``patience``).
        update: updates done.
        epochs_done: complete passes over the training data.
        train_time: training seconds so far (all processes of the run).
        bad_validations: validations in a row without improvement.
    """
    if train.max_updates > 0 and update >= train.max_updates:
        return f"reached train.max_updates={train.max_updates}"
    if train.max_epochs > 0 and epochs_done >= train.max_epochs:
        return f"reached train.max_epochs={train.max_epochs}"
    seconds = time_budget(train)
    if seconds > 0 and train_time >= seconds:
        return f"reached train.max_time={seconds:g}s" + (
            "" if train.max_time is not None else " (the default time budget)"
        )
    if train.patience > 0 and bad_validations >= train.patience:
        return f"no improvement in {train.patience} validations (train.patience)"
    return None


def signal_stop(stopping: GracefulStop | None, update: int, run_dir: Any) -> StopRequested:
    """The :class:`StopRequested` to raise after the update (and its validation) at which the ranks
    found a stop signal, received by this rank or, under torchrun, by another; the caller has saved
    ``checkpoint_last``."""
    name = stopping.received.name if stopping is not None and stopping.received else "a signal on another rank"
    return StopRequested(name, update, f"stopped by {name} after update {update}: checkpoint_last saved in {run_dir}")


@dataclass(frozen=True)
class Due:
    """What an update owes: a log line (``train.log_every``, and the first update), a validation
    (``train.validate_every``), a numbered checkpoint (``train.save_every``). The ranks meet at each."""

    log: bool
    validate: bool
    save: bool

    @property
    def meeting(self) -> bool:
        return self.log or self.validate or self.save


def due_at(train: Any, update: int) -> Due:
    """What update ``update`` (1-based) owes under the ``train`` config."""
    return Due(
        log=update % train.log_every == 0 or update == 1,
        validate=train.validate_every > 0 and update % train.validate_every == 0,
        save=train.save_every > 0 and update % train.save_every == 0,
    )
