"""Divergence guards: a diverging run stops with a sentence that names the update and the last
checkpoint that is truly finite, and non-finite weights are never saved.

The trainer checks the loss, the gradient norm (a finite loss can come with NaN gradients, e.g.
``optim.lr=1e6``) and, before every save, the weights themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from torch import Tensor

__all__ = ["divergence_message", "nonfinite_tensors"]


def nonfinite_tensors(named: Iterable[tuple[str, Tensor]]) -> list[str]:
    """Names of the floating-point tensors holding NaN or ±inf.

    Args:
        named: ``(name, tensor)`` pairs, e.g. ``model.state_dict().items()``.

    Returns:
        The names, in order (empty when every tensor is finite).
    """
    return [name for name, t in named if t.is_floating_point() and not bool(t.isfinite().all())]


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
    return (f"training diverged: {problem} at update {update}; {where} (lower optim.lr, raise "
            "lr_scheduler.warmup_updates, or set train.clip_norm)")
