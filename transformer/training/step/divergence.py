"""Divergence guards: a diverging run stops with a sentence that names the update and the last
checkpoint that is truly finite, and non-finite weights are never saved.

The trainer checks the loss, the gradient norm (a finite loss can come with NaN gradients, e.g.
``optim.lr=1e6``) and, before every save, the weights themselves. :class:`DivergenceWatch` does the
first two without a host sync on an accelerator: the first non-finite update is kept on the device
and read when the trainer logs, validates or saves.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer.training.errors import TrainingError

__all__ = ["DivergenceWatch", "divergence_message", "nonfinite_tensors", "nonfinite_weights"]


class DivergenceWatch:
    """The first update whose loss or gradient norm is not finite.

    On the CPU, where reading a value costs nothing, :meth:`record` checks each update at once and
    raises there, before its optimizer step. On an accelerator it keeps the first non-finite update
    on the device (``[update, 1 for the loss / 0 for the gradient norm, the value]``, fp64; update 0:
    none so far), with no host sync, and :meth:`check` reads it: the trainer calls it every
    ``train.log_every`` updates, before validating and before saving, so a divergence is found up to
    ``log_every`` updates late (the optimizer steps in between; non-finite weights are never saved)
    and the stop message still names the update that diverged.

    Under torchrun each rank records its own loss, and findings are always deferred: :meth:`check`
    (which every rank calls at the same updates) gathers them, so every rank raises at once, naming
    the first update any rank found.

    Args:
        device: the training device.
        world_size: ranks of the run (> 1: findings are gathered by :meth:`check`).

    Attributes:
        deferred: whether findings wait on the device for :meth:`check` (not on the CPU of one
            process, unless :attr:`defer_on_cpu`).
    """

    defer_on_cpu = False
    """Tests set it to run the accelerator's deferred path on the CPU."""

    def __init__(self, device: torch.device, world_size: int = 1) -> None:
        self.world_size = world_size
        self.deferred = torch.device(device).type != "cpu" or self.defer_on_cpu or world_size > 1
        self.device = torch.device(device)
        self.found: Tensor | None = None

    def record(self, update: int, loss: Tensor, grad_norm: Tensor | None, last_saved: tuple[Path, int] | None) -> None:
        """Check one update's loss and (unless None: fp16 leaves overflows to the GradScaler) its
        gradient norm.

        Args:
            update: the update (1-based).
            loss: its summed loss over this rank's batches (a scalar tensor).
            grad_norm: its total gradient norm (a scalar tensor), or None.
            last_saved: ``(stem, update)`` of the newest finite checkpoint, for the message.

        Raises:
            TrainingError: not deferred, when the loss or the gradient norm is not finite.
        """
        if not self.deferred:
            bad_loss = not bool(torch.isfinite(loss))
            if bad_loss or (grad_norm is not None and not bool(torch.isfinite(grad_norm))):
                self._raise(update, bad_loss, float(loss) if bad_loss else float(grad_norm), last_saved)
            return
        loss = loss.detach().double()
        bad_loss = ~torch.isfinite(loss)
        bad, value = bad_loss, loss
        if grad_norm is not None:
            norm = grad_norm.detach().double()
            bad, value = bad_loss | ~torch.isfinite(norm), torch.where(bad_loss, loss, norm)
        finding = torch.stack([bad.double() * update, bad_loss.double(), value])  # (3,)
        self.found = finding if self.found is None else torch.where(self.found[0] > 0, self.found, finding)

    def check(self, last_saved: tuple[Path, int] | None) -> None:
        """Read what :meth:`record` kept (a host sync; nothing when not deferred).

        Raises:
            TrainingError: when an update recorded so far was not finite (the first one is named).
        """
        found = self.found
        if self.world_size > 1:  # every rank's finding; the first update any rank found wins
            mine = found if found is not None else torch.zeros(3, dtype=torch.float64, device=self.device)
            every = [torch.zeros_like(mine) for _ in range(self.world_size)]
            torch.distributed.all_gather(every, mine)
            bad = [f for f in torch.stack(every).tolist() if f[0] > 0]
            if bad:
                update, is_loss, value = min(bad)
                self._raise(int(update), bool(is_loss), value, last_saved)
            return
        if found is None:
            return
        update, is_loss, value = found.tolist()
        if update > 0:
            self._raise(int(update), bool(is_loss), value, last_saved)

    @staticmethod
    def _raise(update: int, is_loss: bool, value: float, last_saved: tuple[Path, int] | None) -> None:
        problem = f"non-finite loss ({value})" if is_loss else f"non-finite gradient norm ({value})"
        raise TrainingError(divergence_message(problem, update, last_saved))


def nonfinite_tensors(named: Iterable[tuple[str, Tensor]]) -> list[str]:
    """Names of the floating-point tensors holding NaN or ±inf.

    Args:
        named: ``(name, tensor)`` pairs, e.g. ``model.state_dict().items()``.

    Returns:
        The names, in order (empty when every tensor is finite).
    """
    return [name for name, t in named if t.is_floating_point() and not bool(t.isfinite().all())]


def nonfinite_weights(model: nn.Module, ema: Any, parallel: Any) -> list[str]:
    """Names of the weights (and moving-average weights) holding NaN or inf, found on every rank:
    each checks its own tensors (its shards under FSDP) and the ranks add up what they found, so
    that all of them stop together.

    Args:
        model: the trained model (DTensor shards under FSDP).
        ema: the :class:`~transformer.training.step.ema.EMA` of its weights, or None.
        parallel: the run's :class:`~transformer.training.distributed.parallel.DataParallel` (``sum_over_ranks``).

    Returns:
        The names found on this rank, or one entry counting those found on other ranks; empty when
        every weight is finite everywhere.
    """
    local = [(name, t.to_local() if hasattr(t, "to_local") else t) for name, t in model.state_dict().items()]
    bad = nonfinite_tensors(local)
    if ema is not None:
        bad += [f"{name} (EMA)" for name in nonfinite_tensors(ema.state_dict().items())]
    n_bad = parallel.sum_over_ranks(len(bad))
    return bad or ([f"{n_bad} tensors on other ranks"] if n_bad else [])


def divergence_message(problem: str, update: int, last_saved: tuple[Path, int] | None) -> str:
    """The stop message of a diverged run.

    Args:
        problem: what was found, e.g. ``"non-finite gradient norm (nan)"``.
        update: the update it was found at (1-based).
        last_saved: ``(checkpoint stem, its update)`` of the newest finite checkpoint of the run
            folder, or None when this run has none.

    Returns:
        One sentence: the problem, the update, the checkpoint to use, and what to change.
    """
    if last_saved is None:
        where = "no checkpoint of this run was saved before it"
    else:
        stem, at = last_saved
        where = f"nothing of it was saved; the last finite checkpoint is {stem.parent}/{stem.name} (update {at})"
    return (
        f"training diverged: {problem} at update {update}; {where} (lower optim.lr, raise "
        "lr_scheduler.warmup_updates, or set train.clip_norm)"
    )
