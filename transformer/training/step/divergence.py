"""Divergence guards: a diverging run stops with a sentence naming the update and the last finite
checkpoint, and non-finite weights are never saved (docs/runs.md#divergence)."""

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

    Not deferred (the CPU of one process), :meth:`record` raises at once, before the optimizer step.
    Deferred (an accelerator, or several ranks), the first finding stays on the device as
    ``[update, 1 for the loss / 0 for the gradient norm, value]`` (fp64; update 0: none) and
    :meth:`check` reads it, gathered over ranks so all raise together."""

    defer_on_cpu = False
    """Tests set it to run the accelerator's deferred path on the CPU."""

    def __init__(self, device: torch.device, world_size: int = 1) -> None:
        self.world_size = world_size
        self.deferred = torch.device(device).type != "cpu" or self.defer_on_cpu or world_size > 1
        self.device = torch.device(device)
        self.found: Tensor | None = None

    def record(self, update: int, loss: Tensor, grad_norm: Tensor | None, last_saved: tuple[Path, int] | None) -> None:
        """Check one update's summed loss and gradient norm (None under fp16: the GradScaler handles overflows).

        Raises:
            TrainingError: not deferred, when either is not finite.
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
            TrainingError: an update so far was not finite (the first one is named).
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
    def check_weights(
        model: nn.Module, ema: Any, parallel: Any, update: int, last_saved: tuple[Path, int] | None
    ) -> None:
        """Before a save: raise when a weight of the model (or of its moving average) is not
        finite on any rank (:func:`nonfinite_weights`; every rank calls it and raises together).

        Raises:
            TrainingError: naming up to three such tensors and the last finite checkpoint.
        """
        bad = nonfinite_weights(model, ema, parallel)
        if bad:
            raise TrainingError(divergence_message(f"non-finite weights ({', '.join(bad[:3])})", update, last_saved))

    @staticmethod
    def _raise(update: int, is_loss: bool, value: float, last_saved: tuple[Path, int] | None) -> None:
        problem = f"non-finite loss ({value})" if is_loss else f"non-finite gradient norm ({value})"
        raise TrainingError(divergence_message(problem, update, last_saved))


def nonfinite_tensors(named: Iterable[tuple[str, Tensor]]) -> list[str]:
    """Names of the floating-point tensors of ``(name, tensor)`` pairs holding NaN or ±inf, in order."""
    return [name for name, t in named if t.is_floating_point() and not bool(t.isfinite().all())]


def nonfinite_weights(model: nn.Module, ema: Any, parallel: Any) -> list[str]:
    """Names of the model's (and EMA's) weights holding NaN or inf on this rank, or one entry counting
    those of other ranks; summed over ranks, so every rank stops together."""
    local = [(name, t.to_local() if hasattr(t, "to_local") else t) for name, t in model.state_dict().items()]
    bad = nonfinite_tensors(local)
    if ema is not None:
        bad += [f"{name} (EMA)" for name in nonfinite_tensors(ema.state_dict().items())]
    n_bad = parallel.sum_over_ranks(len(bad))
    return bad or ([f"{n_bad} tensors on other ranks"] if n_bad else [])


def divergence_message(problem: str, update: int, last_saved: tuple[Path, int] | None) -> str:
    """One sentence: ``problem`` at ``update``, the last finite checkpoint (``(stem, update)`` or None),
    and what to change."""
    if last_saved is None:
        where = "no checkpoint of this run was saved before it"
    else:
        stem, at = last_saved
        where = f"nothing of it was saved; the last finite checkpoint is {stem.parent}/{stem.name} (update {at})"
    return (
        f"training diverged: {problem} at update {update}; {where} (lower optim.lr, raise "
        "lr_scheduler.warmup_updates, or set train.clip_norm)"
    )
