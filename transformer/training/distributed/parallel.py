"""Data parallelism with torch's engines: DistributedDataParallel or FSDP2, plus activation checkpointing.

Every update's gradient is the gradient of the *summed* label-smoothed loss of all micro-batches
of all ranks, divided by the global number of target tokens (fairseq's normalisation). Both
engines are set to **sum** gradients across ranks instead of averaging them (DDP: a sum
communication hook; FSDP2: gradient divide factor 1), and the trainer divides by the global token
count afterwards, so ``N`` ranks compute the same update as one rank with ``update_freq=N`` (up to
the order of summation).

* ``train.distributed=ddp``: :class:`torch.nn.parallel.DistributedDataParallel` over the model and
  its loss; the all-reduce of each gradient bucket overlaps the backward pass; micro-batches
  before the last of an update run under ``no_sync()`` (accumulation without communication).
* ``train.distributed=fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``) on every Transformer
  layer, then on the whole model (embeddings, output layer, final norms): parameters, gradients
  and optimizer state are sharded across ranks and gathered layer by layer. With
  ``train.precision=bf16`` the policy computes in bf16 and reduces gradients in fp32
  (:class:`~torch.distributed.fsdp.MixedPrecisionPolicy`). Checkpoints stay full weights in the
  usual safetensors format (gathered on rank 0, which writes them).
* ``train.activation_checkpointing=true``: each layer keeps only its input and recomputes its
  activations in the backward pass (torch's composable ``checkpoint``, module names unchanged).

One process (no torchrun) uses the model as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._composable import checkpoint
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

__all__ = ["DISTRIBUTED", "DataParallel", "TrainingLoss", "checkpoint_layers", "transformer_layers"]

DISTRIBUTED = ("ddp", "fsdp")


class TrainingLoss(nn.Module):
    """The model and its loss as one module (what DDP/FSDP wrap: their hooks run in its forward).

    Args:
        model: an encoder-decoder or decoder-only model.
        criterion: a :class:`~transformer.training.step.criterion.LabelSmoothedCrossEntropy`.
        features: optional replacement of ``model.features`` (e.g. a ``torch.compile`` d one).
    """

    def __init__(self, model: nn.Module, criterion: Any, features: Any = None) -> None:
        super().__init__()
        self.model = model
        self.criterion = criterion
        self.features = features

    def forward(self, net_input: dict[str, Tensor], target: Tensor) -> dict[str, Tensor | int]:
        """``{"loss", "nll_loss", "ntokens"}`` sums of one batch (see
        :func:`~transformer.training.step.criterion.model_loss`); ``target`` is ``(batch, seq_len)``."""
        return model_loss(self.model, self.criterion, net_input, target, features=self.features)


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """The Transformer layers of a model (every stack's ``layers``), in order.

    Args:
        model: a model whose stacks are ``encoder`` / ``decoder`` (or ``layers``-holding modules).

    Returns:
        The layer modules (FSDP units and checkpointing units).
    """
    return [
        layer
        for module in model.modules()
        if isinstance(getattr(module, "layers", None), nn.ModuleList)
        for layer in module.layers
    ]


def checkpoint_layers(model: nn.Module) -> int:
    """Activation checkpointing per layer (Chen et al. 2016): each layer saves its input only and
    recomputes its activations in the backward pass. The RNG state is replayed, so dropout masks
    and hence gradients are the same as without checkpointing; parameter names do not change.

    Args:
        model: the model (modified in place).

    Returns:
        The number of layers checkpointed.
    """
    layers = transformer_layers(model)
    for layer in layers:
        checkpoint(layer)
    return len(layers)


def _sum_hook(process_group, bucket):  # no annotations: DDP checks them against dist.GradBucket
    """DDP communication hook: all-reduce a gradient bucket (:class:`dist.GradBucket`) as a sum
    (DDP's default divides by the world size; the trainer divides by the global token count
    instead). Returns a future of the reduced flat buffer."""
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class DataParallel:
    """How the gradients of one model are shared between ranks (none, DDP or FSDP2).

    Args:
        loss_module: a :class:`TrainingLoss` over the model, on this rank's device.
        mode: ``ddp`` or ``fsdp`` (``train.distributed``); ignored with one process.
        dist_info: rank / world size / device.
        param_dtype: FSDP2's compute dtype for parameters (``torch.bfloat16`` under
            ``train.precision=bf16``); ``None`` keeps fp32.

    Raises:
        ValueError: an unknown ``mode``.
    """

    def __init__(
        self, loss_module: TrainingLoss, mode: str, dist_info: DistInfo, param_dtype: torch.dtype | None = None
    ) -> None:
        if mode not in DISTRIBUTED:
            raise ValueError(f"train.distributed={mode!r} is not one of {', '.join(DISTRIBUTED)}")
        self.dist = dist_info
        self.loss_module = loss_module
        self.mode = mode if dist_info.world_size > 1 else "none"
        self.fsdp_units: list[nn.Module] = []
        self.mean_reduced = self.mode == "fsdp"  # gradients arrive divided by the world size
        if self.mode == "ddp":
            cuda = dist_info.device.type == "cuda"
            self.engine: nn.Module = nn.parallel.DistributedDataParallel(
                loss_module,
                device_ids=[dist_info.device] if cuda else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
            )
            self.engine.register_comm_hook(None, _sum_hook)
        elif self.mode == "fsdp":
            policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
            for layer in transformer_layers(loss_module.model):
                self.fsdp_units.append(fully_shard(layer, mp_policy=policy))
            self.fsdp_units.append(fully_shard(loss_module, mp_policy=policy))
            if dist.get_backend() != "gloo":  # gloo has no PREMUL_SUM: it averages, see normalise()
                for unit in self.fsdp_units:
                    unit.set_gradient_divide_factor(1.0)  # sum, not mean, across ranks
                self.mean_reduced = False
            self.engine = loss_module
        else:
            self.engine = loss_module

    def release(self) -> None:
        """Drop the DistributedDataParallel wrapper (and its ``Reducer``) at the end of a run,
        before the process group is destroyed (:func:`~transformer.training.distributed.process_group.shutdown_distributed`);
        the loss module stays usable on this rank."""
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

    def normalise(self, params: list[Tensor], ntokens: int | Tensor) -> None:
        """Divide the reduced gradients of ``params`` by the global number of target tokens
        (first undoing FSDP2's division by the world size where the backend averaged), in one
        multi-tensor kernel (``torch._foreach_div_``) rather than one launch per parameter. A count
        on the device is not read (no host sync): with no tokens the gradients are zero and stay so."""
        if isinstance(ntokens, Tensor):
            ntokens = ntokens.clamp(min=1).to(torch.float32)
        elif ntokens <= 0:
            return
        grads = [p.grad for p in params]
        if not grads:
            return
        if self.mean_reduced:
            torch._foreach_mul_(grads, self.dist.world_size)
        torch._foreach_div_(grads, ntokens)

    def global_sums(self, ntokens: int | Tensor, loss_sum: float | Tensor) -> tuple[int | Tensor, float | Tensor]:
        """``(ntokens, loss_sum)`` summed over ranks (unchanged with one process). Given a tensor,
        the sums stay on the device (int64 and fp64 scalars; no host sync), else they are read."""
        if self.mode == "none":
            return ntokens, loss_sum
        device = self.dist.device
        t = torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in (ntokens, loss_sum)]
        )
        dist.all_reduce(t)
        if isinstance(ntokens, Tensor) or isinstance(loss_sum, Tensor):
            return t[0].round().long(), t[1]
        return int(round(t[0].item())), float(t[1].item())

    def agree(self, train_time: float, signalled: bool) -> tuple[float, bool]:
        """One clock and one stop flag for all ranks: the largest ``train_time`` (the slowest rank's
        clock, so every rank takes the time budget's decision at the same update) and whether any
        rank received a stop signal. A collective and a host read under torchrun: every rank calls
        it at the same updates (those it logs, validates or saves), never in a quiet update.

        Args:
            train_time: this rank's training seconds so far.
            signalled: whether this rank received a stop signal.

        Returns:
            ``(train_time, signalled)`` agreed over the ranks (this rank's own with one process).
        """
        if self.mode == "none":
            return train_time, signalled
        t = torch.tensor([train_time, 1.0 if signalled else 0.0], dtype=torch.float64, device=self.dist.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        agreed_time, flag = t.tolist()
        return agreed_time, flag > 0

    # ------------------------------------------------------------------ full weights on rank 0

    def full_state_dict(self) -> dict[str, Tensor]:
        """The model's full weights for a checkpoint: on rank 0 (other ranks get ``{}``); under FSDP
        a collective (every rank must call it), gathered to CPU."""
        if self.mode != "fsdp":
            return self.model.state_dict() if self.dist.is_main else {}
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

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
