"""The random number generators' state as tensors, so a resumed run continues bit for bit."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["gather_rng_states", "get_rng_state", "restore_rank_rng", "set_rng_state"]


def get_rng_state() -> dict[str, Tensor]:
    """Capture the random number generators as tensors (storable with ``weights_only``).

    Returns:
        ``{"python": int64 (625,) [version, Mersenne Twister state...], "python_gauss": float64
        (2,) [has_value, value], "numpy": int64 (626,) [pos, has_gauss, keys...], "numpy_gauss":
        float64 (1,), "torch": uint8 CPU state, "cuda": uint8 (devices, state) when CUDA is
        initialised}``.
    """
    version, internal, gauss = random.getstate()
    state = {
        "python": torch.tensor([version, *internal], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }
    _, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = torch.tensor([pos, has_gauss, *keys.tolist()], dtype=torch.int64)
    state["numpy_gauss"] = torch.tensor([cached], dtype=torch.float64)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Tensor]) -> None:
    """Restore generators captured by :func:`get_rng_state`; entries that are absent are skipped.

    CUDA states are restored for ``min(saved, visible)`` devices.

    Args:
        state: the dict returned by :func:`get_rng_state` (tensors on any device).
    """
    if "python" in state:
        values = [int(v) for v in state["python"].tolist()]
        gauss = None
        if "python_gauss" in state and state["python_gauss"][0].item():
            gauss = float(state["python_gauss"][1].item())
        random.setstate((values[0], tuple(values[1:]), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu().to(torch.uint8))
    if "numpy" in state:
        values = [int(v) for v in state["numpy"].tolist()]
        cached = float(state["numpy_gauss"][0].item()) if "numpy_gauss" in state else 0.0
        np.random.set_state(("MT19937", np.array(values[2:], dtype=np.uint32), values[0], values[1], cached))
    if "cuda" in state and torch.cuda.is_available():
        for i in range(min(state["cuda"].shape[0], torch.cuda.device_count())):
            torch.cuda.set_rng_state(state["cuda"][i].cpu().to(torch.uint8), i)


def gather_rng_states(rank: int, world_size: int) -> list[dict[str, Tensor]]:
    """Every rank's :func:`get_rng_state` in rank order on rank 0 (``[]`` on the others); a
    collective under torchrun (every rank calls it)."""
    mine = get_rng_state()
    if world_size == 1:
        return [mine]
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    torch.distributed.gather_object(mine, gathered, dst=0)
    return list(gathered or [])


def restore_rank_rng(state: dict[str, Any], rank: int) -> None:
    """Restore this rank's generators from a training state's ``rng_ranks`` (``rng``: rank 0's,
    all an older checkpoint holds; a rank it lacks continues from it, with a warning, since its
    dropout masks then differ from an uninterrupted run's)."""
    ranks = state.get("rng_ranks") or [state["rng"]]
    if rank < len(ranks):
        set_rng_state(ranks[rank])
        return
    set_rng_state(state["rng"])
    warnings.warn(
        f"rank {rank}: the checkpoint holds the random state of {len(ranks)} rank(s); this rank "
        "continues from rank 0's, so its dropout masks differ from those of an uninterrupted run",
        stacklevel=3,
    )
