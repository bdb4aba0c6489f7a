"""Divergence guards: a diverging run stops with a sentence that names the update and the last
checkpoint that is truly finite, and non-finite weights are never saved.

The trainer checks the loss, the gradient norm (a finite loss can come with NaN gradients, e.g.
``optim.lr=1e6``) and, before every save, the weights themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from typing import Any

from torch import Tensor, nn

__all__ = ["divergence_message", "nonfinite_tensors", "nonfinite_weights"]


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
        ema: the :class:`~transformer.training.ema.EMA` of its weights, or None.
        parallel: the run's :class:`~transformer.training.parallel.DataParallel` (``global_sums``).

    Returns:
        The names found on this rank, or one entry counting those found on other ranks; empty when
        every weight is finite everywhere.
    """
    local = [(name, t.to_local() if hasattr(t, "to_local") else t) for name, t in model.state_dict().items()]
    bad = nonfinite_tensors(local)
    if ema is not None:
        bad += [f"{name} (EMA)" for name in nonfinite_tensors(ema.state_dict().items())]
    n_bad, _ = parallel.global_sums(len(bad), 0.0)
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
    return (f"training diverged: {problem} at update {update}; {where} (lower optim.lr, raise "
            "lr_scheduler.warmup_updates, or set train.clip_norm)")
