"""A run's training batches: this rank's share of the shared batch order, collated and prefetched,
with the epoch and position a checkpoint resumes from."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from transformer.data.batching import TokenBatchSampler
from transformer.data.collate import Batch, collate
from transformer.data.prefetch import Prefetcher
from transformer.training.distributed.process_group import DistInfo

__all__ = ["TrainBatches"]


class TrainBatches:
    """This rank's training batches, epoch after epoch, and where training stands in them.

    Args:
        train_set: the training split (indexable by :func:`~transformer.data.collate.collate`).
        max_tokens: tokens per batch (``train.max_tokens``).
        arch: ``model.arch`` (the batch format).
        seed: the shuffling seed, the same on every rank.
        dist_info: this rank's share of the shared batch order, and the device the batches go to
            (pinned and copied without waiting on CUDA).
        pad_to_multiple: pad lengths to a multiple of this (1: none).
        prefetch: batches collated ahead in a background thread (0: in the caller's thread).
    """

    def __init__(
        self,
        train_set: Any,
        max_tokens: int,
        arch: str,
        seed: int,
        dist_info: DistInfo,
        pad_to_multiple: int,
        prefetch: int,
    ) -> None:
        self.sampler = TokenBatchSampler(
            train_set.src_lengths,
            train_set.tgt_lengths,
            max_tokens,
            arch=arch,
            shuffle=True,
            seed=seed,
            rank=dist_info.rank,
            world_size=dist_info.world_size,
            bucket_multiple=pad_to_multiple,
        )
        self.train_set, self.arch, self.device = train_set, arch, dist_info.device
        self.pad_to_multiple, self.prefetch = pad_to_multiple, prefetch
        self.epoch = 1
        self._position: dict[str, int] | None = None  # of the last batch handed out (see position)

    def _host_batches(self) -> Iterator[tuple[Batch, dict[str, int]]]:
        epoch = self.epoch
        pin = self.device.type == "cuda"
        while True:
            self.sampler.set_epoch(epoch)  # keeps the saved position within the same epoch
            for indices in self.sampler:
                batch = collate(self.train_set, indices, self.arch, pad_to_multiple=self.pad_to_multiple)
                yield batch.pin_memory(training_only=True) if pin else batch, self.sampler.state_dict()
            epoch += 1

    def __call__(self) -> Iterator[Batch]:
        """The training tensors of each batch on the device, from the resume position on; close the
        iterator to stop the prefetching thread. :attr:`epoch` and :meth:`position` follow the
        batches handed out, not those prepared ahead."""
        non_blocking = self.device.type == "cuda"
        with Prefetcher(self._host_batches(), self.prefetch, device=self.device) as ahead:
            for batch, position in ahead:
                self.epoch, self._position = position["epoch"], position
                yield batch.to(self.device, non_blocking=non_blocking, training_only=True)

    def next_update(self, batches: Iterator[Batch], update_freq: int) -> tuple[list[Batch], int]:
        """The next ``update_freq`` micro-batches of ``batches`` and their target tokens over all
        ranks, counted on the host from the shared batch list
        (:meth:`~transformer.data.batching.TokenBatchSampler.step_tokens`)."""
        micro, ntokens = [], 0
        for _ in range(update_freq):
            micro.append(next(batches))
            position = self.position()
            ntokens += self.sampler.step_tokens(position["epoch"], position["position"])
        return micro, ntokens

    def position(self) -> dict[str, int]:
        """``{"epoch", "position"}`` (1-based) of the last batch handed out: a checkpoint's resume
        point (the sampler itself may be ahead, preparing batches)."""
        return dict(self._position) if self._position is not None else self.sampler.state_dict()

    @property
    def epochs_done(self) -> int:
        """Complete passes over the training data (this rank's shard)."""
        position = self.position()
        finished = position["epoch"] == self.epoch and position["position"] >= len(self.sampler)
        return self.epoch - 1 + int(finished)

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler": position, "epoch"}``, as a checkpoint holds them."""
        return {"sampler": self.position(), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's ``sampler`` position and ``epoch``."""
        self.sampler.load_state_dict(state["sampler"])
        self.epoch = int(state["epoch"])
