"""Data parallelism with torch's engines: DistributedDataParallel or FSDP2 (``fully_shard`` per
layer, then the root), plus per-layer activation checkpointing; one process uses the model as it is.

An update's gradient is that of the summed loss over all micro-batches and ranks divided by the
global target tokens (fairseq's normalisation). Every rank knows that count before the update, so
the loss is scaled by ``world_size / ntokens`` (:meth:`DataParallel.loss_scale`) and the engines keep
their averaging reduction: the gradient reduction is a quiet update's only collective. The
switches: docs/switches.md#data-parallel-and-sharded-training."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._composable import checkpoint
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from transformer.training.distributed.process_group import DistInfo
from transformer.training.step.criterion import model_loss

__all__ = [
    "DISTRIBUTED",
    "GRAD_REDUCE_DTYPES",
    "MODES",
    "DataParallel",
    "TrainingLoss",
    "checkpoint_layers",
    "transformer_layers",
]

DISTRIBUTED = ("ddp", "fsdp")


class TrainingLoss(nn.Module):
    """The model and its loss as one module (what DDP/FSDP wrap: their hooks run in its forward)."""

    def __init__(self, model: nn.Module, criterion: Any, features: Any = None) -> None:
        super().__init__()
        self.model = model
        self.criterion = criterion
        self.features = features

    def forward(self, net_input: dict[str, Tensor], target: Tensor) -> dict[str, Tensor | int]:
        """``{"loss", "nll_loss", "ntokens"}`` sums of one batch
        (:func:`~transformer.training.step.criterion.model_loss`)."""
        return model_loss(self.model, self.criterion, net_input, target, features=self.features)


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """The Transformer layers of a model (every stack's ``layers``), in order: FSDP and checkpointing units."""
    return [
        layer
        for module in model.modules()
        if isinstance(getattr(module, "layers", None), nn.ModuleList)
        for layer in module.layers
    ]


def checkpoint_layers(model: nn.Module) -> int:
    """Activation checkpointing per layer (Chen et al. 2016), in place; returns the layers checkpointed.
    The RNG state is replayed, so dropout and gradients are unchanged; parameter names too."""
    layers = transformer_layers(model)
    for layer in layers:
        checkpoint(layer)
    return len(layers)


MODES = ("none", *DISTRIBUTED)
GRAD_REDUCE_DTYPES = {"fp32": None, "bf16": torch.bfloat16}
"""``train.grad_reduce_dtype`` -> the dtype gradients cross the network in (None: as computed, fp32)."""


class DataParallel:
    """How the gradients of one model are shared between ranks (none, DDP or FSDP2).

    Args:
        mode: ``none``, ``ddp`` or ``fsdp``, taken as given (DDP over one rank measures its overhead).
        param_dtype: FSDP2's compute dtype (bf16 under ``train.precision=bf16``); None keeps fp32.
        bucket_cap_mb, static_graph: DDP's (``train.bucket_cap_mb``, ``train.static_graph``).
        grad_reduce_dtype: ``fp32`` or ``bf16``: the dtype gradients are reduced in.
        reshard_after_forward: FSDP2's (``train.reshard_after_forward``).

    Raises:
        ValueError: an unknown ``mode`` or ``grad_reduce_dtype``, or ``ddp`` / ``fsdp`` without a
            process group.
    """

    def __init__(
        self,
        loss_module: TrainingLoss,
        mode: str,
        dist_info: DistInfo,
        param_dtype: torch.dtype | None = None,
        *,
        bucket_cap_mb: float = 25.0,
        static_graph: bool = False,
        grad_reduce_dtype: str = "fp32",
        reshard_after_forward: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"train.distributed={mode!r} is not one of {', '.join(DISTRIBUTED)}")
        if grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
            raise ValueError(
                f"train.grad_reduce_dtype={grad_reduce_dtype!r} is not one of {', '.join(GRAD_REDUCE_DTYPES)}"
            )
        if mode != "none" and not dist.is_initialized():
            raise ValueError(f"train.distributed={mode} needs a process group (run under torchrun)")
        self.dist = dist_info
        self.loss_module = loss_module
        self.mode = mode
        self.fsdp_units: list[nn.Module] = []
        self._replica: nn.Module | None = None  # FSDP: an unsharded copy on each rank for evaluation
        reduce_dtype = GRAD_REDUCE_DTYPES[grad_reduce_dtype]
        if self.mode == "ddp":
            cuda = dist_info.device.type == "cuda"
            self.engine: nn.Module = nn.parallel.DistributedDataParallel(
                loss_module,
                device_ids=[dist_info.device] if cuda else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
                bucket_cap_mb=bucket_cap_mb,
                static_graph=static_graph,
            )
            # the reducer's own C++ all-reduce (an average) unless the gradients travel in bf16
            if reduce_dtype is torch.bfloat16:
                self.engine.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif self.mode == "fsdp":
            policy = MixedPrecisionPolicy(
                param_dtype=param_dtype, reduce_dtype=reduce_dtype or (torch.float32 if param_dtype else None)
            )
            for layer in transformer_layers(loss_module.model):
                self.fsdp_units.append(
                    fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard_after_forward)
                )
            self.fsdp_units.append(fully_shard(loss_module, mp_policy=policy))  # FSDP2 keeps the root's gathered
            self.engine = loss_module
        else:
            self.engine = loss_module

    def release(self) -> None:
        """Drop the DistributedDataParallel wrapper (and its ``Reducer``) before the process group is
        destroyed; the loss module stays usable on this rank."""
        self.engine = self.loss_module

    @property
    def model(self) -> nn.Module:
        """The wrapped model (its parameters are DTensor shards under FSDP)."""
        return self.loss_module.model

    def __call__(self, net_input: dict[str, Tensor], target: Tensor) -> dict[str, Tensor | int]:
        """The loss of one micro-batch through the engine (its hooks run here)."""
        return self.engine(net_input, target)

    @contextlib.contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        """Context of one micro-batch's forward and backward: gradients are only communicated for
        the ``last`` micro-batch of an update (accumulated locally before)."""
        if self.mode == "ddp" and not last:
            with self.engine.no_sync():
                yield
        elif self.mode == "fsdp":
            self.loss_module.set_requires_gradient_sync(last)
            yield
        else:
            yield

    def loss_scale(self, ntokens: int) -> float:
        """The factor of the summed loss before the backward pass: ``world_size / ntokens``, so that
        the engines' averaging reduction leaves the gradient of the update's summed loss divided by
        its ``ntokens`` target tokens over all ranks (``1 / ntokens`` with one process)."""
        return (self.dist.world_size if self.mode != "none" else 1) / max(int(ntokens), 1)

    def sum_over_ranks(self, value: int) -> int:
        """An integer summed over the ranks (a collective and a host read; ``value`` with one process)."""
        if self.mode == "none":
            return int(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.dist.device)
        dist.all_reduce(t)
        return int(round(t.item()))

    def agree(self, train_time: float, signalled: bool) -> tuple[float, bool]:
        """``(train_time, signalled)`` agreed over the ranks: the slowest rank's clock and whether any
        rank got a stop signal. A collective: every rank calls it at the same updates, never a quiet one."""
        if self.mode == "none":
            return train_time, signalled
        t = torch.tensor([train_time, 1.0 if signalled else 0.0], dtype=torch.float64, device=self.dist.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        agreed_time, flag = t.tolist()
        return agreed_time, flag > 0

    # ------------------------------------------------------------------ full weights on rank 0

    def full_state_dict(self, every_rank: bool = False) -> dict[str, Tensor]:
        """The model's full weights: for a checkpoint, on rank 0 (other ranks get ``{}``), under FSDP
        gathered to the CPU; with ``every_rank``, on every rank (under FSDP on the device: a model
        each rank can decode with). Under FSDP a collective (every rank must call it)."""
        if self.mode != "fsdp":
            return self.model.state_dict() if self.dist.is_main or every_rank else {}
        options = StateDictOptions(full_state_dict=True, cpu_offload=not every_rank)
        return get_model_state_dict(self.model, options=options)

    def eval_model(self, build: Callable[[], nn.Module]) -> nn.Module:
        """A model each rank can evaluate alone: the trained model, or under FSDP an unsharded copy
        (made once by ``build``) loaded with the gathered weights (a collective: every rank calls it)."""
        if self.mode != "fsdp":
            return self.model
        weights = self.full_state_dict(every_rank=True)
        if self._replica is None:
            self._replica = build()
        self._replica.load_state_dict(weights, strict=True)
        return self._replica

    def load_full_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load full weights (every rank passes the same dict; under FSDP each keeps its shard).

        Raises:
            RuntimeError: names that are missing or unexpected (as ``load_state_dict(strict=True)``).
        """
        if self.mode != "fsdp":
            self.model.load_state_dict(state, strict=True)
            return
        expected = set(self.model.state_dict())
        if set(state) != expected:
            raise RuntimeError(
                f"weights do not fit the model: missing {sorted(expected - set(state))}, "
                f"unexpected {sorted(set(state) - expected)}"
            )
        with torch.no_grad():  # tied parameters appear once in named_parameters
            buffers = [(name, b) for name, b in self.model.named_buffers() if name in state]  # persistent ones
            for name, tensor in [*self.model.named_parameters(), *buffers]:
                full = state[name].to(self.dist.device, tensor.dtype)
                if isinstance(tensor, DTensor):
                    full = distribute_tensor(full, tensor.device_mesh, tensor.placements)
                tensor.copy_(full)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer state for a checkpoint (FSDP: the full state keyed by parameter name,
        gathered on rank 0 by a collective)."""
        if self.mode != "fsdp":
            return optimizer.state_dict()
        return get_optimizer_state_dict(
            self.model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Restore :meth:`optimizer_state_dict` output (every rank passes the same dict)."""
        if self.mode != "fsdp":
            optimizer.load_state_dict(state)
            return
        set_optimizer_state_dict(self.model, optimizer, state, options=StateDictOptions(full_state_dict=True))
