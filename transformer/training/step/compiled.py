"""``train.compile``: the training step's forward, loss and backward as compiled graphs (``auto``,
the default, compiles on accelerators and runs eager on a CPU: :data:`AUTO_COMPILE`).

:func:`compile_training_step` compiles the module the trainer calls for each micro-batch (the
model and its loss, :class:`~transformer.training.distributed.parallel.TrainingLoss`, or the DDP
engine around it): the embeddings, every layer, the output layer fused with the label-smoothed
loss and a mixture of experts' router losses are one graph (``torch.compile``'s AOTAutograd then
compiles their backward as one graph too). No option of any group breaks it
(:func:`transformer.testing.check_compiles` holds every option, built-in or a plugin's, to that).
Under FSDP2 each Transformer layer's forward is compiled instead (as torchtitan does): FSDP2's
hooks around a layer (gathering its weights, reducing its gradients) are not traceable, so the
whole engine would break into a graph per stretch between them; the embeddings, the output layer
and the loss stay eager there. The optimizer step, the gradient clipping and the scheduler stay
eager: whether compiling them pays is a GPU measurement not made yet.

Shapes are **dynamic** (``dynamic=True``): the batch's rows and lengths are symbols from the first
compilation on, so an epoch of token batches, which brings a new ``(rows, length)`` shape nearly
every batch (``train.pad_to_multiple`` bounds their number), compiles one graph instead of one per
shape, and never runs into dynamo's recompile limit (8 per function; past it the step would fall
back to eager silently). Each call compiles

* without **duck sizing** (``torch.fx.experimental._config.use_duck_shape=False``): by default
  dynamo gives sizes that are equal in the first batch one symbol, so a first batch whose source
  and target lengths coincide compiles a graph guarded on their equality, and the next batch
  where they differ compiles a second one;
* with Python numbers as constants (``torch._dynamo.config`` ``specialize_int`` and
  ``specialize_float``): ``dynamic=True`` would otherwise trace a float (the label smoothing, a
  dropout probability) as a symbol, which the compiler specialises after tracing the graph once,
  then traces it again from the start; and an FSDP2 layer's integer attributes (its head counts)
  as symbols, on which attention's arguments then depend.

A batch of **one row** still compiles its own graph the first time one comes (dynamo specialises
sizes 0 and 1; the default run's epoch has none). Static shapes (``dynamic=False``) would give
each shape its own specialised kernels at one compilation per distinct shape, minutes of
compiling for a model on a GPU and beyond the recompile limit after 8 shapes. CUDA graphs
(``mode="reduce-overhead"``) record one graph per shape either way.
``tests/training/step/test_compile.py`` counts the compilations of an epoch;
``tests/training/step/test_compile_inductor.py`` holds the inductor-compiled step to eager's numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx.experimental._config as shape_config
from torch import nn

from transformer.training.errors import TrainingError

__all__ = [
    "AUTO_COMPILE",
    "BACKEND",
    "compile_dynamic",
    "compile_errors_named",
    "compile_training_step",
    "compiled_graphs",
    "resolve_compile",
]

AUTO_COMPILE: dict[str, bool] = {"cpu": False, "cuda": True}
"""Whether ``train.compile=auto`` compiles, by device type; a device type not listed compiles. On a
GPU an eager update is host-bound (thousands of kernel launches: docs/gpu.md); on a CPU the compiled
step trains at 0.68x eager's pace, compile time included (docs/benchmarks/gpu_path_ab/README.md)."""


def resolve_compile(value: bool | str, device_type: str) -> bool:
    """``train.compile`` as a bool: ``value`` itself, or (``"auto"``) :data:`AUTO_COMPILE`'s entry.

    Raises:
        ValueError: neither ``auto`` nor a bool.
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return AUTO_COMPILE.get(device_type, True)
    if not isinstance(value, bool):
        raise ValueError(f"train.compile={value!r} is not one of auto, true, false")
    return value


BACKEND = "inductor"
"""The ``torch.compile`` backend of the training step (``tests/training/step/test_compile.py`` sets
``eager``: dynamo's graphs, guards and recompilations without code generation)."""


def _compiling_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose calls run with duck sizing off and Python numbers specialised (dynamo reads these
    settings when a compilation starts, and a call is where a compilation or recompilation starts)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with (
            shape_config.patch(use_duck_shape=False),
            torch._dynamo.config.patch(specialize_int=True, specialize_float=True),
        ):
            return fn(*args, **kwargs)

    return call


def compile_dynamic(fn: Any, backend: str | None = None) -> Any:
    """``torch.compile(fn, dynamic=True)`` compiling without duck sizing and with Python numbers as
    constants (see the module docstring).

    Args:
        fn: a module (its compiled version forwards attribute access to it, so DDP's ``no_sync``
            keeps working) or a function.
        backend: a ``torch.compile`` backend; None: :data:`BACKEND`.

    Returns:
        The compiled module (an ``OptimizedModule``) or function.
    """
    compiled = torch.compile(fn, dynamic=True, backend=backend or BACKEND)
    if isinstance(compiled, nn.Module):
        compiled.forward = _compiling_settings(compiled.forward)
        return compiled
    return _compiling_settings(compiled)


def compile_training_step(parallel: Any, backend: str | None = None) -> nn.Module:
    """Compile what :class:`~transformer.training.distributed.parallel.DataParallel` calls per
    micro-batch, with dynamic shapes (:func:`compile_dynamic`).

    One process or DDP: ``parallel.engine`` (the loss module, or DDP around it) is replaced by its
    compiled version, which forwards attribute access to the original (DDP's ``no_sync`` keeps
    working); ``DataParallel.release`` drops it with the engine. FSDP2: each Transformer layer's
    ``forward`` is compiled instead, and the engine stays eager (FSDP2's hooks around a layer,
    which gather its weights before the forward and reduce its gradients after the backward, are
    not traceable: compiling the whole engine breaks the graph at every layer).

    Args:
        parallel: the trainer's :class:`~transformer.training.distributed.parallel.DataParallel`.
        backend: a ``torch.compile`` backend; None: :data:`BACKEND`.

    Returns:
        ``parallel.engine`` (compiled, except under FSDP2).
    """
    if parallel.mode == "fsdp":
        for unit in parallel.fsdp_units:
            if unit is not parallel.loss_module:  # a layer: its instance's forward, FSDP2's hooks around it stay eager
                unit.forward = compile_dynamic(unit.forward, backend)
        return parallel.engine
    parallel.engine = compile_dynamic(parallel.engine, backend)
    return parallel.engine


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (``torch._dynamo.utils.counters``: each
    first compilation and recompilation of a frame counts once)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _compiler_error(err: BaseException) -> bool:
    """Whether ``err`` comes from ``torch.compile`` (dynamo tracing, a backend, inductor's code)."""
    import torch._dynamo  # loaded by torch.compile already

    return isinstance(err, torch._dynamo.exc.TorchDynamoException) or type(err).__module__.startswith(
        ("torch._dynamo", "torch._inductor")
    )


@contextmanager
def compile_errors_named(compiling: bool) -> Iterator[None]:
    """Around a process's first compiled update (``compiling``): an error of dynamo or inductor
    becomes one :class:`~transformer.training.errors.TrainingError` line naming it and the eager
    switch; other errors, and every error when not ``compiling``, pass unchanged."""
    try:
        yield
    except Exception as err:
        if not (compiling and _compiler_error(err)):
            raise
        what = " ".join(str(err).split())[:300]
        raise TrainingError(
            f"train.compile: the training step failed to compile ({type(err).__name__}: {what}); "
            "train eagerly with train.compile=false"
        ) from err
