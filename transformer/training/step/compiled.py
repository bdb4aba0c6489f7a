"""``train.compile=true``: the training step's forward, loss and backward as compiled graphs.

:func:`compile_training_step` compiles the module the trainer calls for each micro-batch (the
model and its loss, :class:`~transformer.training.distributed.parallel.TrainingLoss`, or the DDP / FSDP2
engine around it): the embeddings, every layer, the output layer fused with the label-smoothed
loss and a mixture of experts' router losses are one graph (``torch.compile``'s AOTAutograd then
compiles their backward as one graph too). No option of any group breaks it
(:func:`transformer.testing.check_compiles` holds every option, built-in or a plugin's, to that).
The optimizer step, the gradient clipping and the scheduler stay eager: whether compiling them pays
is a GPU measurement not made yet.

Shapes are **dynamic** (``dynamic=True``): the batch's rows and lengths are symbols from the first
compilation on, so an epoch of token batches, which brings a new ``(rows, length)`` shape nearly
every batch (``train.pad_to_multiple`` bounds their number), compiles one graph (plus one where a
size of 1 is specialised) instead of one per shape, and never runs into dynamo's recompile limit
(8 per function; past it the step would fall back to eager silently). Static shapes
(``dynamic=False``, or ``mark_dynamic`` left out) would give each shape its own specialised
kernels at one compilation per distinct shape, minutes of compiling for a model on a GPU and
beyond the recompile limit after 8 shapes. CUDA graphs (``mode="reduce-overhead"``) record one
graph per shape either way. ``tests/training/test_compile.py`` counts the compilations of an epoch
against its distinct batch shapes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["BACKEND", "compile_training_step", "compiled_graphs"]

BACKEND = "inductor"
"""The ``torch.compile`` backend of the training step (the tests set ``aot_eager``: the same graphs,
forward and backward, without code generation)."""


def compile_training_step(parallel: Any, backend: str | None = None) -> nn.Module:
    """Replace ``parallel.engine`` (what :class:`~transformer.training.distributed.parallel.DataParallel` calls
    per micro-batch) by its compiled version, with dynamic shapes.

    The compiled module forwards attribute access to the original (DDP's ``no_sync`` keeps working);
    ``DataParallel.release`` drops it with the engine.

    Args:
        parallel: the trainer's :class:`~transformer.training.distributed.parallel.DataParallel`.
        backend: a ``torch.compile`` backend; None: :data:`BACKEND`.

    Returns:
        The compiled engine (also set as ``parallel.engine``).
    """
    parallel.engine = torch.compile(parallel.engine, dynamic=True, backend=backend or BACKEND)
    return parallel.engine


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (``torch._dynamo.utils.counters``: each
    first compilation and recompilation of a frame counts once)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
