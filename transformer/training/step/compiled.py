"""``train.compile``: the training step's forward, loss and backward as compiled graphs with dynamic
shapes, without duck sizing and with Python numbers as constants. Under FSDP2 each layer's forward
is compiled instead. Why each choice: docs/switches.md#compiling."""

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
"""Whether ``train.compile=auto`` compiles, by device type (unlisted: compiles): docs/switches.md#compiling."""


def resolve_compile(value: bool | str, device_type: str) -> bool:
    """``train.compile`` as a bool: ``value``, or for ``"auto"`` :data:`AUTO_COMPILE`'s entry.

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
    """``fn`` whose calls run with duck sizing off and Python numbers specialised (dynamo reads
    these settings when a compilation starts)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with (
            shape_config.patch(use_duck_shape=False),
            torch._dynamo.config.patch(specialize_int=True, specialize_float=True),
        ):
            return fn(*args, **kwargs)

    return call


def compile_dynamic(fn: Any, backend: str | None = None) -> Any:
    """``torch.compile(fn, dynamic=True, backend=backend or BACKEND)`` with this module's settings; a
    compiled module forwards attribute access to ``fn`` (DDP's ``no_sync`` keeps working)."""
    compiled = torch.compile(fn, dynamic=True, backend=backend or BACKEND)
    if isinstance(compiled, nn.Module):
        compiled.forward = _compiling_settings(compiled.forward)
        return compiled
    return _compiling_settings(compiled)


def compile_training_step(parallel: Any, backend: str | None = None) -> nn.Module:
    """Compile what :class:`~transformer.training.distributed.parallel.DataParallel` calls per
    micro-batch and return ``parallel.engine``: the engine itself (one process or DDP), or each
    Transformer layer's ``forward`` under FSDP2, whose hooks around a layer are not traceable."""
    if parallel.mode == "fsdp":
        for unit in parallel.fsdp_units:
            if unit is not parallel.loss_module:  # a layer: its instance's forward, FSDP2's hooks around it stay eager
                unit.forward = compile_dynamic(unit.forward, backend)
        return parallel.engine
    parallel.engine = compile_dynamic(parallel.engine, backend)
    return parallel.engine


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (first compilations and recompilations)."""
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
