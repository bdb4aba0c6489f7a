"""Crash-safe checkpoints: three files sharing a stem, ``{name}.safetensors`` (the weights; metadata
with the format tag, a ``checkpoint_id`` and the model config), ``{name}.pt`` (the plain training
state, read with ``weights_only=True``) and ``{name}.json`` (readable metadata), all staged before
any is moved into place; a pair from two saves is refused by its ``checkpoint_id``. The format:
docs/contributing.md#the-checkpoint-format.

Modules: :mod:`.format`, :mod:`.files` (save, load, average), :mod:`.manager` (a run's last / best /
numbered checkpoints), :mod:`.averaging` (``scripts/average_checkpoints.py``, ``checkpoint_avg``),
:mod:`.rng`."""

from transformer.runs.io import atomic_write, weights_for_safetensors
from transformer.runs.io import write_safetensors as save_weights
from transformer.runs.weights import CheckpointError
from transformer.training.checkpoint.averaging import average_checkpoints, save_run_average, write_average
from transformer.training.checkpoint.files import load_checkpoint, load_weights, save_checkpoint
from transformer.training.checkpoint.manager import CheckpointManager, numbered_checkpoints, remove_stale_temporaries
from transformer.training.checkpoint.rng import get_rng_state, set_rng_state

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "atomic_write",
    "average_checkpoints",
    "get_rng_state",
    "load_checkpoint",
    "load_weights",
    "numbered_checkpoints",
    "remove_stale_temporaries",
    "save_checkpoint",
    "save_run_average",
    "save_weights",
    "set_rng_state",
    "weights_for_safetensors",
    "write_average",
]
