"""Token-bounded, length-bucketed batches (fairseq's ``--max-tokens``, Ott et al. 2019), sharded
across ranks and resumable mid-epoch. How batches are packed, sharded and bucketed:
docs/design.md#token-batches.

Item length (the positions one example occupies, padding counted in ``max_tokens``):

* ``encoder_decoder``: ``max(len(src), len(tgt)) + 1`` (EOS or BOS added);
* ``decoder_only``: ``len(src) + 1 + len(tgt)`` (``src + [SEP] + tgt``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

ARCHS = ("encoder_decoder", "decoder_only")


def item_lengths(
    src_lengths: Sequence[int] | np.ndarray, tgt_lengths: Sequence[int] | np.ndarray, arch: str
) -> np.ndarray:
    """``(n,)`` int64 item lengths (module docstring) from source and target lengths without specials.

    Raises:
        ValueError: unknown ``arch`` or different numbers of source and target lengths.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r} is not one of {', '.join(ARCHS)}")
    src = np.asarray(src_lengths, dtype=np.int64).reshape(-1)
    tgt = np.asarray(tgt_lengths, dtype=np.int64).reshape(-1)
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source lengths but {len(tgt)} target lengths")
    if arch == "encoder_decoder":
        return np.maximum(src, tgt) + 1
    return src + 1 + tgt


AUTO_PAD_TO_MULTIPLE: dict[tuple[str, str], int] = {
    ("cpu", "fp32"): 1,
    ("cpu", "bf16"): 1,
    ("cpu", "fp16"): 1,
    ("cuda", "fp32"): 8,
    ("cuda", "bf16"): 8,
    ("cuda", "fp16"): 8,
}
"""``(device type, resolved precision) -> multiple`` of ``train.pad_to_multiple=auto``; any other
device takes 8 (docs/design.md#token-batches)."""


def resolve_pad_to_multiple(value: int | str, device_type: str, precision: str) -> int:
    """``train.pad_to_multiple`` as a number: ``value``, or for ``"auto"`` the
    :data:`AUTO_PAD_TO_MULTIPLE` entry of the device type and resolved precision.

    Raises:
        ValueError: ``value`` is neither ``"auto"`` nor an integer >= 1.
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return AUTO_PAD_TO_MULTIPLE.get((device_type, precision), 8)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"train.pad_to_multiple={value!r} must be auto or an integer >= 1 (1 = no rounding)")
    return value


def _epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"TokenBatchSampler:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class TokenBatchSampler:
    """Index lists for one rank, usable as a DataLoader ``batch_sampler``.

    Args:
        src_lengths, tgt_lengths: per-example lengths in pieces, without specials.
        max_tokens: bound on ``len(batch) * max(item_length)``.
        shuffle: random order per epoch; False gives ascending length, the same every epoch.
        seed: an epoch's order depends only on ``(seed, epoch)``.
        max_sentences: optional bound on examples per batch.
        bucket_multiple: round item lengths up to a multiple of this, one rounded length per batch.

    Raises:
        ValueError: an example alone longer than ``max_tokens`` (named), or invalid arguments.
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | np.ndarray,
        tgt_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        *,
        arch: str = "encoder_decoder",
        shuffle: bool = True,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        max_sentences: int | None = None,
        bucket_multiple: int = 1,
    ) -> None:
        if max_tokens <= 0:
            raise ValueError(f"max_tokens={max_tokens} must be positive")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences={max_sentences} must be >= 1 or None")
        if bucket_multiple < 1:
            raise ValueError(f"bucket_multiple={bucket_multiple} must be >= 1")
        self.bucket_multiple = int(bucket_multiple)
        self.lengths = item_lengths(src_lengths, tgt_lengths, arch)
        too_long = np.flatnonzero(self.lengths > max_tokens)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(
                f"example {i} has length {int(self.lengths[i])} (arch={arch}), more than max_tokens={max_tokens}; "
                f"filter it with data.max_source_positions/max_target_positions or raise max_tokens"
            )
        self.max_tokens = max_tokens
        self.arch = arch
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.max_sentences = max_sentences
        self.epoch = 0
        self.position = 0
        # sort key (item length, then src_len + tgt_len), one int64 per example
        tiebreak = np.asarray(src_lengths, dtype=np.int64).reshape(-1) + np.asarray(
            tgt_lengths, dtype=np.int64
        ).reshape(-1)
        self._key = self.lengths * (int(tiebreak.max(initial=0)) + 1) + tiebreak
        self._sorted = np.argsort(self._key, kind="stable")
        self._bounds = self._pack(self.padded_lengths(self.lengths[self._sorted]))
        self._num_global = len(self._bounds) - 1
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None
        # target tokens of each example as collated (the target ends in EOS), for step_tokens
        self._target_tokens = np.asarray(tgt_lengths, dtype=np.int64).reshape(-1) + 1
        self._step_tokens: dict[int, np.ndarray] = {}  # epoch -> target tokens of each step, all ranks

    # ------------------------------------------------------------------ building one epoch

    def padded_lengths(self, lengths: np.ndarray) -> np.ndarray:
        """``lengths`` rounded up to a multiple of ``bucket_multiple`` (as they are after collation)."""
        m = self.bucket_multiple
        return lengths if m == 1 else -(-lengths // m) * m

    def _pack(self, lengths: np.ndarray) -> np.ndarray:
        """``(n_batches + 1,)`` batch starts of ascending ``lengths``, packed greedily (a batch
        also ends where the rounded length changes)."""
        n = len(lengths)
        cap = self.max_sentences or n + 1
        bounds = [0]
        start = 0
        while start < n:
            k_max = min(cap, n - start, self.max_tokens // int(lengths[start]))
            if self.bucket_multiple > 1:  # never past the end of this rounded length's bucket
                k_max = min(k_max, int(np.searchsorted(lengths, lengths[start], side="right")) - start)
            k_max = max(k_max, 1)  # an item whose rounded length exceeds max_tokens goes alone
            cost = np.arange(1, k_max + 1) * lengths[start : start + k_max]  # increasing
            start += max(1, int(np.searchsorted(cost, self.max_tokens, side="right")))
            bounds.append(start)
        return np.asarray(bounds, dtype=np.int64)

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(order, batch_order)``: example indices in bucketed order, and the global batch order."""
        n, b = len(self.lengths), self._num_global
        if not self.shuffle:
            return self._sorted, np.arange(b)
        g = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
        perm = torch.randperm(n, generator=g).numpy()
        order = perm[np.argsort(self._key[perm], kind="stable")]  # stable: ties keep the random order
        return order, torch.randperm(b, generator=g).numpy()

    def global_batches(self, epoch: int | None = None) -> list[list[int]]:
        """All index lists of an epoch (default: the current), before sharding."""
        order, batch_order = self._epoch(self.epoch if epoch is None else epoch)
        return [order[self._bounds[j] : self._bounds[j + 1]].tolist() for j in batch_order.tolist()]

    def _rank_batches(self) -> tuple[np.ndarray, np.ndarray]:
        """``(order, mine)``: this epoch's example order and this rank's batch numbers."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1], self._cache[2]
        order, batch_order = self._epoch(self.epoch)
        b = len(batch_order)
        padded = -(-b // self.world_size) * self.world_size if b else 0
        # pad by repeating the first batches so that every rank gets as many
        mine = batch_order[np.arange(self.rank, padded, self.world_size) % max(b, 1)] if b else batch_order
        self._cache = (self.epoch, order, mine)
        return order, mine

    def step_tokens(self, epoch: int, position: int) -> int:
        """Target tokens (``tgt_len + 1``) of step ``position`` (1-based) of ``epoch`` summed over
        all ranks, padding repeats included, with no collective. Safe from a prefetching thread.

        Raises:
            ValueError: ``position`` outside the epoch.
        """
        if not 1 <= position <= len(self):
            raise ValueError(f"position={position} is outside [1, {len(self)}] batches per epoch")
        steps = self._step_tokens.get(epoch)
        if steps is None:
            order, batch_order = self._epoch(epoch)
            per_batch = np.add.reduceat(self._target_tokens[order], self._bounds[:-1]) if self._num_global else order
            b, w = self._num_global, self.world_size
            # step j of rank r is global batch (j * W + r) mod b, as _rank_batches shards them
            which = batch_order[np.arange(len(self) * w) % max(b, 1)]
            steps = per_batch[which].reshape(len(self), w).sum(axis=1)
            self._step_tokens = {epoch: steps}  # one epoch at a time: an epoch is read in order
        return int(steps[position - 1])

    # ------------------------------------------------------------------ public protocol

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch :meth:`__iter__` yields; a new epoch resets the position, the same
        epoch keeps it (so ``load_state_dict`` then ``set_epoch`` resumes)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def __iter__(self) -> Iterator[list[int]]:
        """Yield this rank's batches of the current epoch from the saved position.

        A DataLoader with workers runs ahead: save the batches the loop consumed, not ``position``."""
        order, mine = self._rank_batches()
        bounds = self._bounds
        for j in range(self.position, len(mine)):
            self.position = j + 1
            k = int(mine[j])
            yield order[bounds[k] : bounds[k + 1]].tolist()
        self.position = 0

    def shapes(self) -> list[tuple[int, int]]:
        """The distinct ``(rows, padded item length)`` of the epoch's batches, sorted (the same every epoch)."""
        lengths = self.padded_lengths(self.lengths[self._sorted])
        b = self._bounds
        return sorted({(int(b[j + 1] - b[j]), int(lengths[b[j + 1] - 1])) for j in range(self._num_global)})

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return -(-self._num_global // self.world_size)

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": e, "position": p}``: ``p`` batches of epoch ``e`` handed out on this rank."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the next :meth:`__iter__` continues from there.

        Raises:
            ValueError: the position is beyond the epoch's length.
        """
        epoch, position = int(state["epoch"]), int(state["position"])
        if not 0 <= position <= len(self):
            raise ValueError(f"position={position} is outside [0, {len(self)}] batches per epoch")
        self.epoch, self.position = epoch, position


__all__ = ["ARCHS", "AUTO_PAD_TO_MULTIPLE", "TokenBatchSampler", "item_lengths", "resolve_pad_to_multiple"]
