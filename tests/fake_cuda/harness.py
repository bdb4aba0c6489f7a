"""Run the project's own GPU path on fake ``cuda:0`` tensors (see :mod:`tests.fake_cuda`).

:class:`FakeCuda` is entered around the code under test. Inside it:

* ``torch.cuda.is_available()`` and the few ``torch.cuda`` queries the project makes (bf16 support,
  capability, memory statistics) answer as a GPU would; ``torch.autocast("cuda")`` and
  ``torch.amp.GradScaler("cuda")`` therefore stay enabled;
* a :class:`~torch._subclasses.fake_tensor.FakeTensorMode` turns every tensor put on ``cuda`` into a
  fake tensor: shapes, dtypes and devices are computed, no data. An operator that meets a
  ``cuda:0`` tensor and a non-scalar CPU tensor raises ``FakeTensorDeviceMismatchError``;
* :class:`HostSide` runs host-only work (operators with no fake tensor and no ``device="cuda"``:
  the data pipeline, Python-side bookkeeping) on real CPU tensors, and answers what fake tensors
  cannot: a value read by the host (``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()``,
  ``.cpu()``) and a shape that depends on values (``nonzero``, ``bincount``, boolean-mask indexing,
  ``unique_consecutive``). Each such *host sync* is recorded with the project line that made it
  (:attr:`HostSide.syncs`). A fake tensor whose values the host knows (moved there from the host,
  made by ``arange``/``full``/... on the device, or computed from such tensors alone: token ids,
  lengths, row and sentence indices) carries them along, computed on the CPU beside it, and a sync
  reads them; one the model computed (logits, routing, which beams end) is answered from
  :data:`ANSWERS`, else by :data:`DEFAULTS` (and a mixture of experts' load is even). The dry run
  checks where tensors live and which dtypes meet, never what the model's tensors hold.
* every copy of a real host tensor to the device is recorded (:attr:`HostSide.copies`): whether the
  host waits for it (``non_blocking=False``) and whether its source is pinned. This CPU-only torch
  cannot pin (``Tensor.pin_memory`` needs an accelerator), so inside :class:`FakeCuda` pinning returns
  a copy that :attr:`HostSide.pinned` remembers and ``Tensor.is_pinned`` answers from. The modes are
  thread-local: a background thread (the trainer's batch prefetching) runs plain CPU torch, unseen,
  and only its pinning is recorded (by thread name, :attr:`HostSide.pinned_by`).

A model is built on the CPU as the project builds it and then converted (:meth:`FakeCuda.to_device`,
what ``Module.to`` does to parameters and buffers, ties kept): torch cannot ``Module.to`` fake
parameters in place (it swaps them, which their weak references forbid).
"""

from __future__ import annotations

import linecache
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode

import transformer
from transformer.data.collate import Batch

CUDA = torch.device("cuda", 0)
PROJECT = str(Path(transformer.__file__).resolve().parent)
aten = torch.ops.aten

# (function, the line's source text) of a host sync -> the answers it gets, in order (the last one
# repeats). Values: a bool/int/float for a scalar read, "all" / "none" / an int for the rows a
# value-dependent shape keeps. Everything not listed gets DEFAULTS.
ANSWERS: dict[tuple[str, str], list[Any]] = {
    # training: no update diverged (DivergenceWatch's one read: update 0 = none)
    ("check", "update, is_loss, value = found.tolist()"): [0.0],
    # decoding (the answers count from the start of each search, see dry_run.decode_valid): greedy's
    # one read per step (rows ended, rows with non-finite logits): none at the first step, all
    # rows at the second (where EOS is forced); beam search's (done sentences, dying beams,
    # parents) is zeros: nothing ends before the length bound, which the host knows
    (
        "_greedy_or_sample",
        "status = torch.stack((nxt.eq(eos) & ~bad, bad)).cpu()  # (2, rows): the step's one host read",
    ): [[[False], [False]], [[True], [False]]],
}
DEFAULTS = {torch.bool: True, "int": 0, "float": 1.0, "rows": "all"}
_PRIM_DEVICE = torch.ops.prim.device.default
_LIKE = (aten.ones_like.default, aten.zeros_like.default, aten.full_like.default)
_COPIES = (aten._to_copy, aten.to, aten.copy_)


@dataclass
class Sync:
    """One host sync: what (``item``, ``to_cpu``, or the value-dependent operator), where (the
    innermost project line: ``file:line function``), in which phase of the dry run, the answer, and
    the source text of that line."""

    kind: str
    site: str
    phase: str
    answer: Any
    text: str = ""


@dataclass
class Copy:
    """One copy of a real host tensor to the device: in which phase, at which project line (the
    innermost one that is not in :data:`BATCH_FILE`: who moved it), whether the host waits for it
    (``non_blocking=False``), whether the source was pinned, and whether the source is a training
    tensor of a :class:`~transformer.data.collate.Batch` (``net_input`` or ``target``)."""

    phase: str
    site: str
    non_blocking: bool
    pinned: bool
    batch: bool


BATCH_FILE = "transformer/data/collate.py"
"""Where :meth:`~transformer.data.collate.Batch.to` runs: a copy there is reported at its caller."""


def project_frame() -> tuple[str, str, str] | None:
    """``(file:line, function, source line)`` of the innermost stack frame in the ``transformer`` package."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(PROJECT):
            line = linecache.getline(name, f.f_lineno).strip()
            return f"{Path(name).relative_to(Path(PROJECT).parent)}:{f.f_lineno}", f.f_code.co_name, line
        f = f.f_back
    return None


class HostSide(TorchDispatchMode):
    """Real CPU execution of host-only operators; invented answers to host syncs (see module docstring).

    Args:
        answers: overrides of :data:`ANSWERS`.
    """

    def __init__(self, answers: dict[tuple[str, str], list[Any]] | None = None) -> None:
        super().__init__()
        self.answers = {**ANSWERS, **(answers or {})}
        self.calls: Counter = Counter()
        self.ops: Counter = Counter()  # phase -> operators dispatched
        self.launches: dict[str, Counter] = {}  # phase -> {operator: times} of those that met the device
        self.syncs: list[Sync] = []
        self.phase = "setup"
        self.plans: dict[int, tuple[Tensor, Tensor]] = {}  # id(fake) -> (fake, its planned real values)
        self.fed: dict[int, tuple[Tensor, str]] = {}  # id(host tensor) -> (it, where it entered the GPU path)
        self.copies: list[Copy] = []
        # weak, so that a freed tensor's id reused by a new one is not taken for it
        self.pinned: dict[int, weakref.ref] = {}  # id(host tensor) -> it, for those pinned
        self.pinned_by: Counter = Counter()  # thread name -> tensors pinned there
        self.batch_tensors: dict[int, weakref.ref] = {}  # id(host tensor) -> it: a Batch's net_input / target

    # --------------------------------------------------------------- host memory

    @staticmethod
    def _known(table: dict[int, weakref.ref], t: Tensor) -> bool:
        ref = table.get(id(t))
        return ref is not None and ref() is t

    def is_pinned(self, t: Tensor) -> bool:
        """Whether ``t`` came from :meth:`pin_memory` (a device tensor never is)."""
        return self._known(self.pinned, t)

    def pin_memory(self, t: Tensor) -> Tensor:
        """``t`` in (pretend) page-locked memory: ``t`` itself when pinned already, else a copy
        remembered as pinned, as ``Tensor.pin_memory`` returns.

        Raises:
            RuntimeError: ``t`` is not a host tensor (torch refuses to pin device memory too).
        """
        if isinstance(t, FakeTensor) or t.device.type != "cpu":
            raise RuntimeError(f"cannot pin '{t.device}' memory: only dense CPU tensors can be pinned")
        if self.is_pinned(t):
            return t
        with unset_fake_temporarily():
            out = t.clone()
        self.pinned[id(out)] = weakref.ref(out)
        self.pinned_by[threading.current_thread().name] += 1
        return out

    def note_batch(self, tensors: Iterable[Tensor]) -> None:
        """Remember the host tensors among ``tensors`` (a batch's training tensors) as batch tensors."""
        for t in tensors:
            if isinstance(t, Tensor) and not isinstance(t, FakeTensor):
                self.batch_tensors[id(t)] = weakref.ref(t)

    def _record_copy(self, func, args: tuple, kwargs: dict) -> None:
        """Record ``func`` as a :class:`Copy` when it copies a real host tensor to a device tensor
        (``_to_copy`` / ``to`` with a device destination, ``copy_`` into a fake tensor)."""
        bound = {a.name: v for a, v in zip(func._schema.arguments, args)}
        bound.update(kwargs)
        if func.overloadpacket is aten.copy_:
            src, dst = bound.get("src"), bound.get("self")
            to_device = isinstance(dst, FakeTensor) and dst.device.type != "cpu"
        else:  # _to_copy, to
            src, dst = bound.get("self"), bound.get("other", bound.get("device"))
            dst = dst.device if isinstance(dst, Tensor) else dst
            to_device = dst is not None and torch.device(dst).type != "cpu"
        if not to_device or not isinstance(src, Tensor) or isinstance(src, FakeTensor) or src.device.type != "cpu":
            return
        site = "<torch>"
        f = sys._getframe(1)
        while f is not None:  # the innermost project line outside Batch.to: who moved the tensor
            name = f.f_code.co_filename
            if name.startswith(PROJECT) and not name.endswith(BATCH_FILE):
                site = f"{Path(name).relative_to(Path(PROJECT).parent)}:{f.f_lineno} {f.f_code.co_name}"
                break
            f = f.f_back
        self.copies.append(
            Copy(
                self.phase,
                site,
                bool(bound.get("non_blocking") or False),
                self.is_pinned(src),
                self._known(self.batch_tensors, src),
            )
        )

    # --------------------------------------------------------------- answers

    def _answer(self, kind: str, default: Any) -> Any:
        where = project_frame()
        site, key = ("<torch>", None) if where is None else (where[0] + " " + where[1], (where[1], where[2]))
        answers = self.answers.get(key) if key else None
        if answers:
            i = self.calls[key]
            self.calls[key] += 1
            value = answers[min(i, len(answers) - 1)]
        else:
            value = default
        self.syncs.append(Sync(kind, site, self.phase, value, "" if where is None else where[2]))
        return value

    def _record(self, kind: str, answer: Any) -> None:
        where = project_frame()
        site, text = ("<torch>", "") if where is None else (f"{where[0]} {where[1]}", where[2])
        self.syncs.append(Sync(kind, site, self.phase, answer, text))

    def _plan(self, t: Tensor) -> Tensor | None:
        entry = self.plans.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None

    def _set_plan(self, fake: Tensor, real: Tensor) -> None:
        self.plans[id(fake)] = (fake, real)

    def _rows(self, answer: Any, n: int) -> int:
        return n if answer == "all" else 0 if answer == "none" else min(int(answer), n)

    # --------------------------------------------------------------- host values

    def _real(self, value: Any) -> Any:
        """An argument as the host computes it: a fake tensor's planned values, ``cuda`` as ``cpu``."""
        if isinstance(value, FakeTensor):
            return self._plan(value)
        if isinstance(value, torch.device) and value.type != "cpu":
            return torch.device("cpu")
        if isinstance(value, (list, tuple)):
            return type(value)(self._real(v) for v in value)
        return value

    def _all_planned(self, args: Any, kwargs: dict) -> bool:
        return all(self._plan(a) is not None for a in _fakes(args) + _fakes(kwargs.values()))

    def _run_on_host(self, func, args, kwargs) -> Any:
        """``func`` on the host values of its arguments (None when the host cannot run it)."""
        real_args, real_kwargs = self._real(args), {k: self._real(v) for k, v in kwargs.items()}
        try:
            with unset_fake_temporarily():
                return func(*real_args, **real_kwargs)
        except Exception:  # noqa: BLE001 - e.g. a CUDA-only kernel: the values stay unknown
            return None

    def _attach(self, out: Any, real: Any) -> None:
        if isinstance(out, FakeTensor) and isinstance(real, Tensor) and real.shape == out.shape:
            self._set_plan(out, real)
        elif isinstance(out, (list, tuple)) and isinstance(real, (list, tuple)):
            for o, r in zip(out, real):
                self._attach(o, r)

    def _track(self, func, args, kwargs, out) -> None:
        """Plan ``out`` when every fake input has a plan (host values through host-side ops); an
        operator that writes unplanned values into a planned tensor drops that plan; ``ones_like``,
        ``zeros_like`` and ``full_like`` are planned whatever their input. Counts made by
        ``scatter_add`` of known values at indices the model computed (a mixture of experts' tokens
        per expert) are invented as even, as :meth:`_value_dependent` answers ``bincount``."""
        if func in (aten.scatter_add_.default, aten.scatter_add.default) and self._even_counts(args, out):
            return
        if func in _LIKE and isinstance(out, FakeTensor):  # the values do not depend on the input's
            with unset_fake_temporarily():
                real = func(
                    torch.empty(out.shape, dtype=out.dtype),
                    *self._real(args[1:]),
                    **{k: self._real(v) for k, v in kwargs.items()},
                )
            self._set_plan(out, real)
            return
        if self._all_planned(args, kwargs):
            real = self._run_on_host(func, args, kwargs)
            if real is not None:
                self._attach(out, real)
                return
        for i, arg in enumerate(func._schema.arguments):
            if (
                arg.alias_info is not None
                and arg.alias_info.is_write
                and i < len(args)
                and isinstance(args[i], FakeTensor)
            ):
                self.plans.pop(id(args[i]), None)

    def _even_counts(self, args: tuple, out: Any) -> bool:
        """Plan a 1-d ``scatter_add(self, 0, index, src)`` with planned ``self`` and ``src`` and an
        unplanned ``index``: ``src``'s total spread evenly over the bins (True when planned)."""
        base, dim, index, src = args[:4]
        if dim != 0 or base.dim() != 1 or self._plan(index) is not None:
            return False
        base_real, src_real = self._plan(base), self._plan(src)
        if base_real is None or src_real is None or not isinstance(out, FakeTensor):
            return False
        with unset_fake_temporarily():
            n, total = base_real.numel(), int(src_real.sum())
            real = base_real + torch.tensor([total // n + (i < total % n) for i in range(n)], dtype=base_real.dtype)
        self._set_plan(out, real)
        return True

    # --------------------------------------------------------------- dispatch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _PRIM_DEVICE:  # C++ asking a fake tensor's device (most of the calls): FakeTensor answers
            return func(*args)
        kwargs = kwargs or {}
        self.ops[self.phase] += 1
        if func.overloadpacket in _COPIES:
            self._record_copy(func, args, kwargs)
        fake = _has_fake(args) or _has_fake(kwargs.values())
        device = kwargs.get("device")
        if not fake and (device is None or torch.device(device).type == "cpu"):
            with unset_fake_temporarily():  # host-side work: real CPU tensors, real values
                return func(*args, **kwargs)
        self.launches.setdefault(self.phase, Counter())[func.overloadpacket.__name__] += 1
        for a in args:  # host tensors entering the GPU path (copied there, or mixed in as scalars)
            if isinstance(a, Tensor) and not isinstance(a, FakeTensor) and id(a) not in self.fed:
                self.fed[id(a)] = (a, f"{func.overloadpacket.__name__} at {(project_frame() or ('<torch>',))[0]}")
        if func.overloadpacket is aten.to and not fake:  # under inference_mode `to` arrives whole, and
            func, args, kwargs = _as_to_copy(func, args, kwargs)  # FakeTensorMode keeps only _to_copy off the device
        if func.overloadpacket is aten.to and fake and func is not aten.to.other:  # a copy to the host (`.cpu()`) too
            _, copy_args, copy_kwargs = _as_to_copy(func, args, kwargs)
            if copy_kwargs.get("device") is not None and torch.device(copy_kwargs["device"]).type == "cpu":
                return self._read_tensor(copy_args[0], copy_kwargs)
        if func in (aten._local_scalar_dense.default, aten.is_nonzero.default, aten.item.default):
            return self._read_scalar(func, args[0])
        if func is aten._to_copy.default and fake and device is not None and torch.device(device).type == "cpu":
            return self._read_tensor(args[0], kwargs)
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            return self._value_dependent(func, args, kwargs)
        self._track(func, args, kwargs, out)
        return out

    def _read_scalar(self, func, t: Tensor) -> Any:
        """``item()`` / ``bool()`` of a fake tensor: its planned value, else the answer."""
        plan = self._plan(t)
        if plan is not None:
            with unset_fake_temporarily():
                value = plan.item() if func is not aten.is_nonzero.default else bool(plan)
            self._record("item", value)
            return value
        kind = (
            torch.bool
            if t.dtype == torch.bool or func is aten.is_nonzero.default
            else ("float" if t.is_floating_point() else "int")
        )
        return self._answer(f"item ({t.dtype})", DEFAULTS[kind])

    def _read_tensor(self, t: Tensor, kwargs: dict) -> Tensor:
        """A copy of a fake tensor to the host: its planned values, else the answer (a nested list
        broadcast to the tensor's shape, e.g. ``[[True], [False]]`` for ``(2, rows)``), else zeros."""
        plan = self._plan(t)
        answer = self._answer("to_cpu", "zeros" if plan is None else "values")
        with unset_fake_temporarily():
            dtype = kwargs.get("dtype") or t.dtype
            if plan is not None:
                return plan.to(dtype, copy=True)
            if isinstance(answer, list):
                return torch.tensor(answer, dtype=dtype).expand(t.shape).clone()
            return torch.zeros(t.shape, dtype=dtype)

    def _synthetic_mask(self, mask: Tensor, name: str) -> Tensor:
        """Host values for a boolean tensor the model computed: the first ``rows`` elements true
        (``rows`` from :data:`ANSWERS`, default all), as a fake tensor on ``mask``'s device."""
        k = self._rows(self._answer(name, DEFAULTS["rows"]), mask.numel())
        with unset_fake_temporarily():
            real = torch.zeros(mask.numel(), dtype=torch.bool)
            real[:k] = True
            real = real.view(mask.shape)
        out = torch.empty(mask.shape, dtype=torch.bool, device=mask.device)
        self._set_plan(out, real)
        return out

    def _value_dependent(self, func, args, kwargs):
        """An operator whose output shape depends on values: computed on the host values when known;
        else on invented ones (:meth:`_synthetic_mask`, an even expert load)."""
        name = str(func.overloadpacket.__name__)
        known = self._all_planned(args, kwargs)
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
            # a boolean mask as the integer indices it selects (host values, else invented ones)
            indices: list[Any] = []
            for ix in args[1]:
                if isinstance(ix, FakeTensor) and ix.dtype in (torch.bool, torch.uint8):
                    mask = self._plan(ix)
                    if mask is None:
                        mask = self._plan(self._synthetic_mask(ix, f"{name} (boolean mask)"))
                    else:
                        self._record(f"{name} (boolean mask)", "host values")
                    with unset_fake_temporarily():
                        positions = mask.bool().nonzero(as_tuple=True)
                    for p in positions:
                        fake_p = torch.empty(p.shape, dtype=torch.long, device=ix.device)
                        self._set_plan(fake_p, p)
                        indices.append(fake_p)
                else:
                    indices.append(ix)
            return self.__torch_dispatch__(func, (), (args[0], indices, *args[2:]), kwargs)
        if self._plan(args[0]) is None and func is aten.bincount.default:
            t, minlength = args[0], kwargs.get("minlength", args[2] if len(args) > 2 else 0)
            n = max(int(minlength), 1)
            self._answer(name, f"an even load over {n} bins")
            with unset_fake_temporarily():
                base, extra = divmod(t.numel(), n)
                real = torch.tensor([base + (i < extra) for i in range(n)])
            out = torch.empty((n,), dtype=torch.long, device=t.device)
            self._set_plan(out, real)
            return out
        elif self._plan(args[0]) is None and isinstance(args[0], FakeTensor):
            if args[0].dtype != torch.bool and func not in (aten.unique_consecutive.default,):
                raise NotImplementedError(
                    f"fake-CUDA dry run: no answer for the value-dependent {func} at {project_frame()}"
                )
            if func is aten.unique_consecutive.default:  # invented: every element distinct
                t = args[0]
                self._answer(name, "all distinct")
                with unset_fake_temporarily():
                    real_in = torch.arange(t.numel(), dtype=t.dtype).view(t.shape)
                planned = torch.empty(t.shape, dtype=t.dtype, device=t.device)
                self._set_plan(planned, real_in)
            else:
                planned = self._synthetic_mask(args[0], name)
            args = (planned, *args[1:])
        if not self._all_planned(args, kwargs):
            # the values a host read needs are known; the rest of the operator is not
            raise NotImplementedError(
                f"fake-CUDA dry run: no host values for the value-dependent {func} at {project_frame()}"
            )
        if known:
            self._record(name, "host values")
        real = self._run_on_host(func, args, kwargs)
        if real is None:
            raise NotImplementedError(f"fake-CUDA dry run: {func} failed on the host values at {project_frame()}")
        device = next(a.device for a in _fakes(args))
        with unset_fake_temporarily():
            shaped = real
        out = _like_on(shaped, device)
        self._attach(out, real)
        return out


def _like_on(real: Any, device: torch.device) -> Any:
    """Fake tensors of ``real``'s shapes and dtypes on ``device`` (inside the fake mode)."""
    if isinstance(real, Tensor):
        return torch.empty(real.shape, dtype=real.dtype, device=device)
    if isinstance(real, (list, tuple)):
        return type(real)(_like_on(r, device) for r in real)
    return real


def _as_to_copy(func, args, kwargs):
    """``aten.to`` of a host tensor to the (fake) device as the ``aten._to_copy`` it stands for."""
    if func is aten.to.device:
        names = ("device", "dtype", "non_blocking", "copy", "memory_format")
        kwargs = {**dict(zip(names, args[1:])), **kwargs}
    copy = {
        k: kwargs[k] for k in ("dtype", "layout", "device", "pin_memory", "memory_format") if kwargs.get(k) is not None
    }
    return aten._to_copy.default, (args[0],), copy


def _fakes(values: Iterable[Any]) -> list[FakeTensor]:
    out: list[FakeTensor] = []
    for v in values:
        if isinstance(v, FakeTensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += _fakes(v)
    return out


def _has_fake(values: Iterable[Any]) -> bool:
    """Whether a fake tensor is among ``values`` or in a list/tuple among them (operator arguments)."""
    for v in values:
        if isinstance(v, FakeTensor) or (isinstance(v, (list, tuple)) and _has_fake(v)):
            return True
    return False


class _DeviceFreeFakeMode(FakeTensorMode):
    """FakeTensorMode that never materialises a tensor on the device (``torch.cuda.is_available()``
    is patched True inside :class:`FakeCuda`, which would otherwise turn that off)."""

    @property
    def avoid_device_init(self) -> bool:
        return True


class FakeCuda:
    """Context manager: the project's code runs on fake ``cuda:0`` tensors (see module docstring).

    Args:
        answers: overrides of :data:`ANSWERS` for this run.

    Attributes:
        fake_mode: the FakeTensorMode.
        host: the :class:`HostSide` mode (its ``syncs`` and ``phase``).
    """

    def __init__(self, answers: dict[tuple[str, str], list[Any]] | None = None) -> None:
        self.fake_mode = _DeviceFreeFakeMode(allow_non_fake_inputs=True)
        self.host = HostSide(answers)
        self._stack: ExitStack | None = None

    def __enter__(self) -> FakeCuda:
        stack = ExitStack()
        cuda = torch.cuda
        for name, value in {
            "is_available": lambda: True,
            "is_bf16_supported": lambda *a, **k: True,
            "get_device_capability": lambda *a, **k: (9, 0),
            "get_device_name": lambda *a, **k: "fake CUDA device",
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda *a, **k: None,
            "synchronize": lambda *a, **k: None,
            "empty_cache": lambda: None,
            "reset_peak_memory_stats": lambda *a, **k: None,
            "max_memory_allocated": lambda *a, **k: 0,
            "memory_allocated": lambda *a, **k: 0,
            "max_memory_reserved": lambda *a, **k: 0,
        }.items():
            stack.enter_context(mock.patch.object(cuda, name, value))
        # the backward pass on the calling thread (as under torch.compile's tracing): no device threads
        stack.enter_context(torch.autograd.set_multithreading_enabled(False))
        # pinning needs an accelerator on this torch build; every thread pins (the prefetching one too)
        host = self.host
        stack.enter_context(mock.patch.object(Tensor, "pin_memory", lambda t, device=None: host.pin_memory(t)))
        stack.enter_context(mock.patch.object(Tensor, "is_pinned", lambda t, device=None: host.is_pinned(t)))
        make_batch = Batch.__init__

        def note_batch(batch: Batch, *args: Any, **kwargs: Any) -> None:
            make_batch(batch, *args, **kwargs)
            host.note_batch([*batch.net_input.values(), batch.target])

        stack.enter_context(mock.patch.object(Batch, "__init__", note_batch))
        stack.enter_context(self.fake_mode)
        stack.enter_context(self.host)
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None

    def phase(self, name: str) -> FakeCuda:
        """Label the host syncs recorded from now on (e.g. ``train_step``, ``beam``)."""
        self.host.phase = name
        return self

    def to_device(self, module: nn.Module, device: torch.device = CUDA) -> nn.Module:
        """What ``module.to(device)`` does, for a real CPU module: every parameter and buffer becomes a
        fake tensor on ``device`` (shared ones stay shared); other tensor attributes stay where they are."""
        memo: dict[int, Tensor] = {}
        with torch.no_grad():
            for m in module.modules():
                for store in (m._parameters, m._buffers):
                    for key, t in list(store.items()):
                        if t is None:
                            continue
                        if id(t) not in memo:
                            moved = self.fake_mode.from_tensor(t.detach()).to(device)
                            memo[id(t)] = nn.Parameter(moved, t.requires_grad) if isinstance(t, nn.Parameter) else moved
                        store[key] = memo[id(t)]
        return module

    def syncs(self, phase: str | None = None) -> list[Sync]:
        """The host syncs recorded (of one phase)."""
        return [s for s in self.host.syncs if phase is None or s.phase == phase]


def module_tensors(model: nn.Module, prefix: str = "model") -> Iterator[tuple[str, Tensor]]:
    """Every tensor a model holds: parameters, their gradients, buffers, and plain tensor attributes
    of its modules (tables such as the sinusoids, RoPE frequencies, ALiBi slopes)."""
    for name, p in model.named_parameters(remove_duplicate=False):
        yield f"{prefix}.{name}", p
        if p.grad is not None:
            yield f"{prefix}.{name}.grad", p.grad
    for name, b in model.named_buffers(remove_duplicate=False):
        yield f"{prefix}.{name} (buffer)", b
    for mod_name, m in model.named_modules():
        for key, value in vars(m).items():
            if isinstance(value, Tensor) and not key.startswith("_"):
                yield f"{prefix}.{mod_name}.{key} (attribute)".replace("..", "."), value


def trainer_tensors(trainer: Any) -> Iterator[tuple[str, Tensor]]:
    """Every tensor the training loop keeps between updates: the model's (:func:`module_tensors`), the
    optimizer state, the moving average and the GradScaler's scale and growth tracker."""
    yield from module_tensors(trainer.model)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    for p, state in trainer.optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, Tensor):
                yield f"optimizer.state[{names.get(id(p), '?')}].{key}", value
    for group_i, group in enumerate(trainer.optimizer.param_groups):
        for key, value in group.items():
            if isinstance(value, Tensor):
                yield f"optimizer.param_groups[{group_i}].{key}", value
    if trainer.ema is not None:
        for name, t in zip(trainer.ema.names, trainer.ema.shadow):
            yield f"ema.{name}", t
    for key in ("_scale", "_growth_tracker"):
        value = getattr(trainer.scaler, key, None)
        if isinstance(value, Tensor):
            yield f"scaler.{key}", value


def off_device(
    named: Iterable[tuple[str, Tensor]], host: HostSide | None = None, device: torch.device = CUDA
) -> tuple[list[str], list[str]]:
    """The tensors not on ``device``: ``(problems, notes)``, each ``"name: device"``.

    A plain tensor attribute (a table) left on the host is a problem only when the GPU path read it
    (``host.fed``: it is then copied to the device at every use); one it never read is a note.
    """
    problems, notes = [], []
    for name, t in named:
        if t.device == device:
            continue
        if name.endswith("(attribute)") and host is not None:
            fed = host.fed.get(id(t))
            if fed is None or fed[0] is not t:
                notes.append(f"{name}: {t.device}, never read on the GPU path")
                continue
            problems.append(f"{name}: {t.device}, read by {fed[1]} (a copy to the GPU at every use)")
            continue
        problems.append(f"{name}: {t.device}")
    return problems, notes
