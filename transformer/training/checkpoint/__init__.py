"""Crash-safe checkpoints: weights in safetensors, training state in a ``weights_only`` torch file.

A checkpoint called ``name`` in folder ``d`` is three files sharing the stem ``d / name``:

- ``{name}.safetensors``: the model's ``state_dict()`` (safetensors; loads without pickle); its
  header metadata holds the format tag, the ``checkpoint_id`` and, for training checkpoints, the
  model config (``model_config``, JSON) that loaders compare with the run's config.
- ``{name}.pt``: the training state (optimizer, scheduler, grad scaler, RNG states, sampler
  state, update count, epoch, best metric, config as a plain dict) written with ``torch.save``
  and read with ``torch.load(weights_only=True)``, so it may hold only tensors, Python numbers,
  strings, ``None`` and dicts/lists/tuples of these (checked before writing).
- ``{name}.json``: human-readable metadata (the top-level numbers/strings of the training state).

Atomicity: every file is written to a temporary file in the same folder, flushed and
``fsync``-ed, and only when all three are complete are they moved into place with ``os.replace``
(atomic on POSIX). A crash while writing leaves the previous checkpoint untouched. The weights and
the training state carry the same random ``checkpoint_id``; a crash in the microseconds between
the renames would pair files from two saves, and :func:`load_checkpoint` then refuses them. A
process killed while writing leaves its temporary files (``.{file}.XXXXXXXX.tmp``);
:func:`remove_stale_temporaries` deletes them when a run starts or resumes.

Tied (shared) weights: safetensors refuses tensors that share storage, so every tensor whose
storage was already written is stored as a clone under its own name. Loading with
``model.load_state_dict(state, strict=True)`` copies each name into the model's existing
parameters in place, so a tied parameter is filled (twice, with equal values) and stays tied.

Where things are: :mod:`.format` (the files, the format tag, what the training state may hold),
:mod:`.files` (save, load, read weights, average), :mod:`.manager` (last / best / numbered
checkpoints of a run), :mod:`.averaging` (the last N numbered checkpoints into one file, recording
their run: ``scripts/average_checkpoints.py``; a run's own average, ``checkpoint_avg``, for its final
test: :func:`save_run_average`), :mod:`.rng` (generator states). Atomic writes and the safetensors reader are
:mod:`transformer.io`'s.
"""

from transformer.io import atomic_write, weights_for_safetensors
from transformer.io import write_safetensors as save_weights
from transformer.training.checkpoint.averaging import save_run_average, write_average
from transformer.training.checkpoint.files import average_checkpoints, load_checkpoint, load_weights, save_checkpoint
from transformer.training.checkpoint.format import CheckpointError
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
