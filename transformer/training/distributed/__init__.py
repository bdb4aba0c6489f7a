"""Several processes: the process group from torchrun / SLURM / submitit (:mod:`.process_group`:
:func:`setup_distributed`, :class:`DistInfo`) and the DDP / FSDP2 engine around the model
(:mod:`.parallel`). Imports :mod:`transformer.training.step` (the criterion the engine wraps).

The process group's functions are this package's public API (docs/contributing.md#moved-modules).
"""

from transformer.training.distributed.process_group import (
    DistInfo,
    broadcast_from_main,
    export_submitit_environment,
    setup_distributed,
    shutdown_distributed,
)

__all__ = [
    "DistInfo",
    "broadcast_from_main",
    "export_submitit_environment",
    "setup_distributed",
    "shutdown_distributed",
]
