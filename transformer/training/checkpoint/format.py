"""What a checkpoint's training state holds (:data:`TRAINING_STATE_KEYS`) and may hold (plain
values that ``torch.load(weights_only=True)`` reads: :func:`check_plain`). The files' names,
suffixes and format tag are :mod:`transformer.runs.folder`'s; :mod:`.files` reads and writes them."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

__all__ = ["TRAINING_STATE_KEYS", "check_plain"]

TRAINING_STATE_KEYS = (
    "optimizer",
    "scheduler",
    "scaler",
    "rng",  # rank 0's random state
    "rng_ranks",  # every rank's, in rank order
    "sampler",  # the data position
    "update",
    "epoch",
    "best_metric",
    "bad_validations",
    "train_tokens",
    "train_time",
    "wall_time",
    "ema",
    "routing",
    "config",
)
"""The entries of a run's training state, in the order they are written (its ``.json`` lists them so)."""

_PLAIN_SCALARS = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device)


def check_plain(obj: Any, where: str) -> None:
    """Raise TypeError unless ``obj`` loads with ``torch.load(weights_only=True)``.

    Args:
        obj: the training state (or a part of it).
        where: how to name ``obj`` in the message (``"train_state"``, ``"train_state['rng']"``).

    Raises:
        TypeError: naming the first part that is not a tensor, number, string, None, dtype,
            device or dict/list/tuple of these.
    """
    if isinstance(obj, Tensor) or type(obj) in _PLAIN_SCALARS:
        return
    if type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            if type(k) not in _PLAIN_SCALARS:
                raise TypeError(f"{where} has a key of type {type(k).__name__}; use str or int keys")
            check_plain(v, f"{where}[{k!r}]")
        return
    if type(obj) in (list, tuple, torch.Size):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; the training state may hold only "
        "tensors, numbers, strings, None and dicts/lists/tuples of these (torch.load(weights_only=True)); "
        "convert configs with OmegaConf.to_container / dataclasses.asdict and arrays with torch.as_tensor"
    )
