"""The training loop: the :class:`Trainer` owns the update and hands the rest to its parts.

The parts: the batches and their resume position (:mod:`.batches`), the counters and clocks
(:mod:`.state`), validation (:mod:`.validation`), what an update owes and when training stops
(:mod:`transformer.training.stopping`), checkpoints (:mod:`transformer.training.checkpoint`).
How an update is normalised and when the host reads the device: docs/runs.md#one-update.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer.config import Config, config_dict, time_budget
from transformer.data.batching import resolve_pad_to_multiple
from transformer.data.collate import Batch
from transformer.data.dataset import TranslationData
from transformer.data.prefetch import resolve_prefetch
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID
from transformer.models import build_model
from transformer.precision import AUTOCAST_DTYPES, autocast, resolve_precision
from transformer.training.checkpoint import CheckpointManager
from transformer.training.checkpoint.format import TRAINING_STATE_KEYS
from transformer.training.checkpoint.rng import gather_rng_states, get_rng_state, restore_rank_rng
from transformer.training.distributed.parallel import DataParallel, TrainingLoss, checkpoint_layers
from transformer.training.distributed.process_group import DistInfo
from transformer.training.errors import TrainingError
from transformer.training.loop.batches import TrainBatches
from transformer.training.loop.state import TrainState
from transformer.training.loop.train_log import TrainLog
from transformer.training.loop.validation import Validator
from transformer.training.monitoring.memory import PhaseMemory
from transformer.training.monitoring.progress import TrainingBar
from transformer.training.step import compiled
from transformer.training.step.criterion import LabelSmoothedCrossEntropy
from transformer.training.step.divergence import DivergenceWatch
from transformer.training.step.ema import EMA
from transformer.training.step.optim import build_optimizer, total_norm
from transformer.training.step.routing import RoutingMonitor
from transformer.training.step.schedules import build_scheduler
from transformer.training.stopping import Due, GracefulStop, budget_reached, due_at, signal_stop

__all__ = ["Trainer", "TrainingError"]


class Trainer:
    """Owns the model, the optimiser and the update of one run.

    Args:
        cfg: the resolved, validated :class:`~transformer.config.Config`.
        data: the loaded corpus; ``dist_info``: rank, world size, device; ``run_dir``: the run folder.
        parallel_mode: ``none``, ``ddp`` or ``fsdp``; None: ``train.distributed`` under torchrun,
            ``none`` for one process (``ddp`` over a 1-rank group measures DDP's own cost).
        log: where the run's lines go; None: stderr on rank 0.
        compile_backend: the compiled step's ``torch.compile`` backend; None: inductor.
    """

    def __init__(
        self,
        cfg: Config,
        data: TranslationData,
        dist_info: DistInfo,
        run_dir: Path,
        parallel_mode: str | None = None,
        log: Callable[[str], None] | None = None,
        compile_backend: str | None = None,
    ) -> None:
        self.cfg, self.data, self.dist, self.run_dir = cfg, data, dist_info, run_dir
        t = cfg.train
        self.device = dist_info.device
        self.arch = cfg.model.arch
        torch.manual_seed(cfg.seed)
        self.model = self._build_model()
        if t.activation_checkpointing:
            checkpoint_layers(self.model)
        self.compiled = compiled.resolve_compile(t.compile, self.device.type)  # auto: on accelerators
        # validation's loss runs the compiled layers; training compiles the whole step below
        self.features = compiled.compile_dynamic(self.model.features, compile_backend) if self.compiled else None
        self.criterion = LabelSmoothedCrossEntropy(cfg.criterion.label_smoothing, ignore_index=PAD_ID)
        self.precision = resolve_precision(t.precision, self.device)
        # a run resolved auto before it recorded its config (job/run.py); a Trainer built directly resolves it here
        self.pad_to_multiple = resolve_pad_to_multiple(t.pad_to_multiple, self.device.type, self.precision)
        # DDP or FSDP2 under torchrun; before the optimizer, since FSDP2 replaces parameters by shards
        self.parallel = DataParallel(
            TrainingLoss(self.model, self.criterion),
            parallel_mode or (t.distributed if dist_info.world_size > 1 else "none"),
            dist_info,
            param_dtype=AUTOCAST_DTYPES[self.precision] if self.precision == "bf16" else None,
            bucket_cap_mb=t.bucket_cap_mb,
            static_graph=t.static_graph,
            grad_reduce_dtype=t.grad_reduce_dtype,
            reshard_after_forward=t.reshard_after_forward,
        )
        if self.compiled:
            compiled.compile_training_step(self.parallel, compile_backend)  # one graph per micro-batch, dynamic shapes
        self.routing = RoutingMonitor(self.model, self.parallel.mode != "none")  # MoE: router stats, bias update
        self.optimizer = build_optimizer(self.model, cfg.optim, self.device.type)
        self.scheduler = build_scheduler(
            self.optimizer, cfg.lr_scheduler, cfg.optim.lr, cfg.model.d_model, t.max_updates
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.prefetch = resolve_prefetch(t.prefetch, self.device.type)
        self.train_batches = TrainBatches(
            data.splits["train"], t.max_tokens, self.arch, cfg.seed, dist_info, self.pad_to_multiple, self.prefetch
        )
        self.sampler = self.train_batches.sampler
        self.state = TrainState()
        self.memory = PhaseMemory(self.device)  # peak memory per phase (training, validation, test)
        self.checkpoints = CheckpointManager(run_dir, keep_last=t.keep_last) if dist_info.is_main else None
        # fp32 moving average of the weights; validation, checkpoints' weights and the test use it
        self.ema = EMA(self.model, t.ema_decay) if t.ema_decay > 0 else None
        self.last_saved: tuple[Path, int] | None = None  # newest finite checkpoint (stem, update)
        if log is None:
            log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if dist_info.is_main else (lambda msg: None)
        self.log = log
        self.validator = Validator(cfg, data, self.criterion, dist_info, self.precision, self._autocast, log)
        self.stopping: GracefulStop | None = None  # fit's: the polite stop on train.stop_signals
        self.divergence = DivergenceWatch(self.device, dist_info.world_size)  # the first non-finite loss / norm

    @property
    def update(self) -> int:
        """Updates trained so far."""
        return self.state.update

    @property
    def epoch(self) -> int:
        """The epoch of the last batch trained on (1-based)."""
        return self.train_batches.epoch

    def _build_model(self) -> nn.Module:
        joint = self.data.joint_vocab
        return build_model(
            self.cfg.model,
            len(self.data.src_tokenizer),
            None if joint else len(self.data.tgt_tokenizer),
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            sep_id=SEP_ID,
        ).to(self.device)

    def train_state(self, rng: list[dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
        """A checkpoint's training state (:data:`~transformer.training.checkpoint.format.TRAINING_STATE_KEYS`):
        every part's own state, ``rng`` every rank's random state in rank order (None: this
        process's). With ``train.ema_decay > 0`` the checkpoint's weights are the moving average
        and ``ema`` holds the decay and the training weights."""
        rng = rng or [get_rng_state()]
        ema = {"decay": self.ema.decay, "model": self.model.state_dict()} if self.ema is not None else None
        parts = {
            "optimizer": self.parallel.optimizer_state_dict(self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng[0],
            "rng_ranks": rng,
            **self.train_batches.state_dict(),  # the batches trained on, not those prepared ahead
            **self.state.state_dict(),
            **self.validator.state_dict(),
            "ema": ema,
            "routing": self.routing.last,
            "config": config_dict(self.cfg),
        }
        return {key: parts[key] for key in TRAINING_STATE_KEYS}

    def load_state(
        self, model_state: dict[str, torch.Tensor], state: dict[str, Any], saved_as: Path | None = None
    ) -> None:
        """Restore weights and training state saved by :meth:`save` (every rank loads the same files);
        ``saved_as``: the checkpoint's stem, the newest finite one a divergence message names.
        Turning ``train.ema_decay`` on at resume starts the average from the resumed weights."""
        saved_ema = state.get("ema")
        self.parallel.load_full_state_dict(saved_ema["model"] if saved_ema else model_state)
        if self.ema is not None:
            if saved_ema:
                self.ema.load_state_dict(model_state)
            else:
                self.ema = EMA(self.model, self.ema.decay)
        self.parallel.load_optimizer_state_dict(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.train_batches.load_state_dict(state)
        restore_rank_rng(state, self.dist.rank)
        self.state.load_state_dict(state)
        self.validator.load_state_dict(state)
        self.routing.load_last(state.get("routing"))
        if saved_as is not None:
            self.last_saved = (saved_as, self.update)

    def save(self, is_best: bool = False, numbered: bool = False) -> None:
        """Atomically write ``checkpoint_last`` (and best / numbered) on rank 0: full weights in
        safetensors, even under FSDP (where every rank takes part in gathering them).

        Raises:
            TrainingError: a non-finite loss, gradient norm or weight (nothing written; every rank raises).
        """
        self.divergence.check(self.last_saved)
        self.divergence.check_weights(self.model, self.ema, self.parallel, self.update, self.last_saved)
        rng = gather_rng_states(self.dist.rank, self.dist.world_size)  # a collective under torchrun
        if self.checkpoints is not None or self.parallel.mode == "fsdp":
            weights, state = self.parallel.full_state_dict(), self.train_state(rng)
            if self.checkpoints is not None:
                if self.ema is not None:
                    weights = self.ema.state_dict()
                self.checkpoints.save(self.update, weights, state, is_best=is_best, numbered=numbered)
        self.last_saved = (self.run_dir / CheckpointManager.LAST, self.update)  # on every rank: the same stop message

    def unshard_for_test(self) -> None:
        """Under FSDP, decode the final test with full weights: the trained model replaced by an
        unsharded copy on every rank (a collective); nothing to do otherwise."""
        if self.parallel.mode == "fsdp":
            self.model = self.parallel.eval_model(self._build_model)

    def _autocast(self) -> AbstractContextManager[Any]:
        return autocast(self.precision, self.device)

    def micro_loss(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One micro-batch's summed losses through DDP / FSDP2 (or the bare model) under the run's
        autocast; the output layer is fused with the loss (:class:`TrainingLoss`)."""
        with self._autocast():
            return self.parallel(batch.net_input, batch.target)

    def batches(self) -> Iterator[Batch]:
        """This rank's training batches on the device from the resume position
        (:class:`~transformer.training.loop.batches.TrainBatches`); close it to stop prefetching."""
        return self.train_batches()

    def train_step(self, batches: list[Batch], ntokens: int | None = None) -> dict[str, Any]:
        """One update over this rank's micro-batches ``batches`` (on the device), reading nothing on
        the host; ``ntokens``: the update's target tokens over all ranks (None: counted by a collective).

        Returns:
            The statistics on the device, for :func:`~transformer.training.step.update_stats.read_stats`:
            ``loss_sum`` and ``nll_sum`` (fp64, this rank), ``local_tokens`` and ``ntokens`` (ints),
            ``lr``, ``grad_norm``, and ``routing`` for a mixture of experts.

        Raises:
            TrainingError: a non-finite loss or gradient norm, on the CPU of one process (elsewhere
                :meth:`DivergenceWatch.check` finds it later).
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        local_tokens = sum(b.ntokens for b in batches)
        if ntokens is None:
            ntokens = self.parallel.sum_over_ranks(local_tokens)
        scale = self.parallel.loss_scale(ntokens)
        loss_sum = nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # as the floats they replace
        for i, batch in enumerate(batches):
            with self.parallel.accumulate(last=i == len(batches) - 1):  # gradients averaged over ranks
                out = self.micro_loss(batch)
                objective = out["loss"] + out["router_loss"] if "router_loss" in out else out["loss"]
                self.scaler.scale(objective * scale).backward()
            self.routing.add(out)
            loss_sum = loss_sum + out["loss"].detach().double()
            nll_sum = nll_sum + out["nll_loss"].detach().double()
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.cfg.train.clip_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip) if clip > 0 else total_norm(params)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor of partial norms
            grad_norm = grad_norm.full_tensor()
        # a finite loss can come with NaN gradients; fp16 leaves overflowing gradients to the GradScaler
        self.divergence.record(
            self.update + 1, loss_sum, grad_norm if self.precision != "fp16" else None, self.last_saved
        )
        lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        routing = self.routing.finish()  # MoE: loads over all ranks, DeepSeek-V3 bias update
        if self.ema is not None:
            self.ema.update(self.model)
        with warnings.catch_warnings():
            # fp16: the GradScaler skips the optimizer step of an update whose gradients overflowed;
            # the update still counts and the schedule advances (torch warns about that order)
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        self.state.update += 1
        self.state.train_tokens += ntokens
        return dict(
            loss_sum=loss_sum,
            nll_sum=nll_sum,
            local_tokens=local_tokens,
            ntokens=ntokens,
            lr=lr,
            grad_norm=grad_norm,
            routing=routing,
        )

    def validate(self, logger: Any) -> bool:
        """One validation round (:meth:`Validator.validate`) of the trained model, or of its moving
        average when on; under FSDP the weights are gathered on every rank. Every rank calls it.
        Returns whether this is the best result so far."""
        self.memory.enter("validation")
        try:
            model = self.parallel.eval_model(self._build_model)  # FSDP: gathers the weights (every rank)
            with self.ema.swapped(model) if self.ema is not None else nullcontext():
                features = self.features if model is self.model else None
                return self.validator.validate(model, self.update, logger, features)
        finally:
            self.memory.enter("training")

    def stop_reason(self, train_time: float | None = None) -> str | None:
        """Why training stops now (:func:`~transformer.training.stopping.budget_reached`), or None;
        ``train_time``: the seconds to judge the time budget by (default: the ranks' agreed clock)."""
        return budget_reached(
            self.cfg.train,
            update=self.update,
            epochs_done=self.train_batches.epochs_done,
            train_time=self.state.train_time if train_time is None else train_time,
            bad_validations=self.validator.bad_validations,
        )

    def _signal_received(self) -> bool:
        return self.stopping is not None and self.stopping.requested

    def _meet(self, due: Due) -> tuple[bool, bool, str | None]:
        """``(met, signalled, stop)``: whether the ranks meet after this update (where ``due``, or at
        a limit; one process after every update), whether a stop signal arrived, why training stops."""
        meet = due.meeting
        if not meet and self.parallel.mode == "none":
            meet = self.stop_reason(self.state.running_time()) is not None or self._signal_received()
        elif not meet:
            meet = self.stop_reason() is not None
        if not meet:
            return False, False, None
        self.state.tick(self.device)
        self.state.train_time, signalled = self.parallel.agree(self.state.train_time, self._signal_received())
        return True, signalled, self.stop_reason()

    def fit(self, logger: Any, stopping: GracefulStop | None = None) -> str:
        """Train until a ``train.*`` limit is reached (each update, then what it owes:
        docs/runs.md#one-update) with a ``MetricsLogger`` and the run's ``GracefulStop`` (or None).
        Returns the reason training stopped.

        Raises:
            TrainingError: a non-finite loss or gradient norm (the last good checkpoint stays).
            StopRequested: a stop signal, after saving ``checkpoint_last``.
        """
        t = self.cfg.train
        self.stopping = stopping
        progress = TrainingBar(
            max_updates=t.max_updates,
            max_time=time_budget(t),
            update=self.update,
            train_time=self.state.train_time,
            desc=f"train {self.precision}",
            enabled=self.dist.is_main and bool(t.progress),
        )
        batches = self.batches()
        first_update = self.update  # the update this process compiles its step at (train.compile)
        self.memory.enter("training")
        stop = self.stop_reason()
        train_log = TrainLog(logger, self.state.train_time)
        self.state.restart_clock()
        try:
            while stop is None:
                step_start = time.time()
                with compiled.compile_errors_named(self.compiled and self.update == first_update):
                    stats = self.train_step(*self.train_batches.next_update(batches, t.update_freq))
                train_log.add(stats)
                due = due_at(t, self.update)
                met, signalled, stop = self._meet(due)
                if due.log or stop is not None:  # and the last update
                    self.divergence.check(self.last_saved)  # before the host reads the numbers
                    train_log.write(stats, self.update, self.epoch, self.state.train_time)
                progress.step(time.time() - step_start, self.update, **train_log.postfix(stats["lr"]))
                if due.validate or stop is not None:
                    self.divergence.check(self.last_saved)
                    is_best = self.validate(logger)
                    stop = self.stop_reason()
                    # the end is a numbered checkpoint when the test averages them, so that the
                    # tested weights include the last updates (a budget's or a resume's end off the grid)
                    self.save(
                        is_best=is_best,
                        numbered=due.save or (stop is not None and t.average_last > 0 and t.save_every > 0),
                    )
                elif due.save:
                    self.save(numbered=True)
                if met:
                    self.state.restart_clock()  # validating and saving are not training time
                if signalled or (self.parallel.mode == "none" and self._signal_received()):
                    if stop is None:
                        if self.last_saved is None or self.last_saved[1] != self.update:
                            self.save()
                        raise signal_stop(self.stopping, self.update, self.run_dir)
                    self.log(f"a stop signal arrived at update {self.update}, where training stops anyway: {stop}")
        finally:
            batches.close()  # stops the prefetching thread
            progress.close()
        return stop
