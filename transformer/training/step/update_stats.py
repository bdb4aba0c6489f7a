"""The numbers the trainer logs for an update, read from the device values of
:meth:`~transformer.training.loop.trainer.Trainer.train_step` in one host sync (every ``train.log_every``
updates: the updates in between read nothing)."""

from __future__ import annotations

from typing import Any

import torch

from transformer.training.step.routing import read_routing

__all__ = ["host_values", "read_stats"]


def host_values(values: list[Any]) -> list[float]:
    """``values`` (scalar tensors, ints, floats) as floats, every tensor read in one host sync (fp64:
    exact for fp32 values and for counts below 2**53)."""
    tensors = [v.detach().reshape(()).double() for v in values if isinstance(v, torch.Tensor)]
    read = iter(torch.stack(tensors).tolist() if tensors else [])
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]


def read_stats(stats: dict[str, Any], window_tokens: Any = None) -> dict[str, Any]:
    """The logged numbers of one update (one host read for all of them, one more for a mixture of
    experts' routing).

    Args:
        stats: what :meth:`~transformer.training.loop.trainer.Trainer.train_step` returned.
        window_tokens: optional token count (an int or a device tensor) to read in the same sync.

    Returns:
        ``loss`` and ``nll_loss`` per target token (base e, this rank's batches), ``ntokens`` (all
        ranks), ``lr``, ``grad_norm``, a mixture of experts' routing metrics
        (:func:`~transformer.training.step.routing.read_routing`), and ``window_tokens`` when given.
    """
    names = ["loss_sum", "nll_sum", "local_tokens", "ntokens", "grad_norm"]
    values = [stats[k] for k in names] + ([window_tokens] if window_tokens is not None else [])
    got = dict(zip(names + ["window_tokens"], host_values(values)))
    local = max(int(got["local_tokens"]), 1)
    out = {
        "loss": got["loss_sum"] / local,
        "nll_loss": got["nll_sum"] / local,
        "ntokens": int(got["ntokens"]),
        "lr": stats["lr"],
        "grad_norm": got["grad_norm"],
        **read_routing(stats["routing"]),
    }
    if window_tokens is not None:
        out["window_tokens"] = int(got["window_tokens"])
    return out
