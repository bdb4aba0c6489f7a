"""The training loop behind ``scripts/train.py``: one call trains, validates, tests and reports.

Gradients are normalised per target token over the whole update (all accumulation steps and all
ranks), as in fairseq: each micro-batch contributes its *summed* loss, gradients are summed across
ranks by DistributedDataParallel or FSDP2 (``train.distributed``, see
:mod:`transformer.training.distributed.parallel`), then divided by the global number of target tokens. A
2-process run is therefore the same computation as a 1-process run with ``update_freq=2`` (up to
summation order).

An update reads nothing on the host: its loss sums, token counts, gradient norm and finiteness
check (:class:`~transformer.training.step.divergence.DivergenceWatch`) stay on the device until the host
reads them, every ``train.log_every`` updates, before validating, before saving and at the end.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer.config import Config, config_dict, time_budget
from transformer.data.batching import TokenBatchSampler, resolve_pad_to_multiple
from transformer.data.collate import Batch, collate
from transformer.data.dataset import TranslationData
from transformer.data.prefetch import Prefetcher, resolve_prefetch
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID
from transformer.models import build_model
from transformer.training.checkpoint import CheckpointManager, get_rng_state, set_rng_state
from transformer.training.distributed.parallel import DataParallel, TrainingLoss, checkpoint_layers
from transformer.training.distributed.process_group import DistInfo, broadcast_from_main
from transformer.training.errors import TrainingError
from transformer.training.loop.validation import scorable_pairs, teacher_forced_loss, translate_and_score
from transformer.training.monitoring.memory import PhaseMemory
from transformer.training.monitoring.progress import TrainingBar
from transformer.training.step.compiled import compile_dynamic, compile_training_step, resolve_compile
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, perplexity
from transformer.training.step.divergence import DivergenceWatch, divergence_message, nonfinite_weights
from transformer.training.step.ema import EMA
from transformer.training.step.optim import build_optimizer, total_norm
from transformer.training.step.precision import resolve_precision
from transformer.training.step.routing import RoutingMonitor, read_routing
from transformer.training.step.schedules import build_scheduler
from transformer.training.step.update_stats import read_stats
from transformer.training.stopping import GracefulStop, budget_reached, stop_on_signal

__all__ = ["Trainer", "TrainingError"]


def _compiler_error(err: BaseException) -> bool:
    """Whether ``err`` comes from ``torch.compile`` (dynamo tracing, a backend, inductor's code)."""
    import torch._dynamo  # loaded by torch.compile already

    return isinstance(err, torch._dynamo.exc.TorchDynamoException) or type(err).__module__.startswith(
        ("torch._dynamo", "torch._inductor")
    )


class Trainer:
    """Owns the model, optimiser, data order and checkpoints of one run.

    Args:
        cfg: the resolved :class:`~transformer.config.Config` (validated by the caller).
        data: the loaded corpus (tokenizers and splits).
        dist_info: rank / world size / device.
        run_dir: the run folder (checkpoints, metrics.jsonl, results.json).
        parallel_mode: the data-parallel engine (``none``, ``ddp``, ``fsdp``); None:
            ``train.distributed`` under torchrun, ``none`` for one process. ``ddp`` over a 1-rank
            process group measures DDP's own cost (``benchmarks/gpu_check``).
        log: where the run's lines go (e.g. the run folder's ``train.log``); None: stderr on rank 0.
        compile_backend: the ``torch.compile`` backend when the step is compiled; None: inductor
            (:data:`~transformer.training.step.compiled.BACKEND`). ``eager`` checks dynamo's graphs
            without generating code.
    """

    read_stats = staticmethod(read_stats)  # the logged numbers of train_step's device values

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
        self.compiled = resolve_compile(t.compile, self.device.type)  # auto: on accelerators
        # compiled: validation's teacher-forced loss runs the compiled layers; training compiles the
        # whole step (forward, fused loss, backward) below
        self.features = compile_dynamic(self.model.features, compile_backend) if self.compiled else None
        self.criterion = LabelSmoothedCrossEntropy(cfg.criterion.label_smoothing, ignore_index=PAD_ID)
        self.precision = resolve_precision(t.precision, self.device)
        # a run resolved auto before it recorded its config (job/run.py); a Trainer built directly resolves it here
        self.pad_to_multiple = resolve_pad_to_multiple(t.pad_to_multiple, self.device.type, self.precision)
        self.autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.precision]
        # DDP or FSDP2 under torchrun; before the optimizer, since FSDP2 replaces parameters by shards
        self.parallel = DataParallel(
            TrainingLoss(self.model, self.criterion),
            parallel_mode or (t.distributed if dist_info.world_size > 1 else "none"),
            dist_info,
            param_dtype=self.autocast_dtype if self.precision == "bf16" else None,
            bucket_cap_mb=t.bucket_cap_mb,
            static_graph=t.static_graph,
            grad_reduce_dtype=t.grad_reduce_dtype,
            reshard_after_forward=t.reshard_after_forward,
        )
        if self.compiled:
            compile_training_step(self.parallel, compile_backend)  # one graph per micro-batch, dynamic shapes
        self._replica: nn.Module | None = None  # FSDP: an unsharded copy on each rank for evaluation
        self.routing = RoutingMonitor(self.model, self.parallel.mode != "none")  # MoE: router stats, bias update
        self._routing: dict[str, Any] = {}  # MoE: the last update's routing, read (last_routing) or on the device
        self.optimizer = build_optimizer(self.model, cfg.optim, self.device.type)
        self.scheduler = build_scheduler(
            self.optimizer, cfg.lr_scheduler, cfg.optim.lr, cfg.model.d_model, t.max_updates
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        train = data.splits["train"]
        self.train_set = train
        self.sampler = TokenBatchSampler(
            train.src_lengths,
            train.tgt_lengths,
            t.max_tokens,
            arch=self.arch,
            shuffle=True,
            seed=cfg.seed,
            rank=dist_info.rank,
            world_size=dist_info.world_size,
            bucket_multiple=self.pad_to_multiple,
        )
        self.prefetch = resolve_prefetch(t.prefetch, self.device.type)
        self._data_position: dict[str, int] | None = None  # see data_position
        self.update = 0
        self.epoch = 1
        self.best_metric: float | None = None
        self.bad_validations = 0
        self.train_tokens = 0  # target tokens trained on so far (all ranks), counted on the host
        self.train_time = 0.0  # training seconds of the run, at the ranks' last meeting (see fit)
        self._clock_start = time.time()  # since when training time runs and is not yet in train_time
        self.wall_time_before = 0.0  # wall seconds of the earlier processes of this run (resumes)
        self.started = time.time()
        self.memory = PhaseMemory(self.device)  # peak memory per phase (training, validation, test)
        self.checkpoints = CheckpointManager(run_dir, keep_last=t.keep_last) if dist_info.is_main else None
        # fp32 moving average of the weights; validation, checkpoints' weights and the test use it
        self.ema = EMA(self.model, t.ema_decay) if t.ema_decay > 0 else None
        self.last_saved: tuple[Path, int] | None = None  # newest finite checkpoint (stem, update)
        self.valid_set = scorable_pairs(
            data.splits["valid"], cfg.model
        )  # (pairs the model can score, a note to log once)
        if log is None:
            log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if dist_info.is_main else (lambda msg: None)
        self.log = log
        self.stopping: GracefulStop | None = None  # fit's: the polite stop on train.stop_signals
        self.divergence = DivergenceWatch(
            self.device, dist_info.world_size
        )  # the first non-finite loss / gradient norm

    @property
    def last_routing(self) -> dict[str, Any]:
        """A mixture of experts' routing metrics of the last update, read on first access ({}: dense)."""
        if "moe_counts" in self._routing:
            self._routing = read_routing(self._routing)
        return self._routing

    @last_routing.setter
    def last_routing(self, value: dict[str, Any]) -> None:
        self._routing = dict(value)

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

    # ------------------------------------------------------------------ state

    def rng_states(self) -> list[dict[str, torch.Tensor]]:
        """Every rank's random generators (:func:`~transformer.training.checkpoint.get_rng_state`), in
        rank order, on rank 0; other ranks get ``[]``. A collective under torchrun: every rank calls it."""
        mine = get_rng_state()
        if self.dist.world_size == 1:
            return [mine]
        gathered: list[Any] | None = [None] * self.dist.world_size if self.dist.is_main else None
        torch.distributed.gather_object(mine, gathered, dst=0)
        return list(gathered or [])

    def train_state(self, rng: list[dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
        """Everything but the saved weights needed to continue exactly (loadable with weights_only):
        optimizer, scheduler, grad scaler, RNG states, the data position, counters, the config.

        ``rng`` is rank 0's random state and ``rng_ranks`` every rank's (``rng``: :meth:`rng_states`'
        list; None: this process's alone), so that each rank of a resumed run draws the dropout
        masks it would have drawn.

        With ``train.ema_decay > 0`` the checkpoint's weights file holds the moving average (the
        weights to translate with) and ``ema`` here holds the decay and the training weights.
        """
        rng = rng or [get_rng_state()]
        ema = None
        if self.ema is not None:
            ema = {"decay": self.ema.decay, "model": self.model.state_dict()}
        return {
            "optimizer": self.parallel.optimizer_state_dict(self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng[0],
            "rng_ranks": rng,
            "sampler": self.data_position(),  # the batches trained on, not those prepared ahead
            "update": self.update,
            "epoch": self.epoch,
            "best_metric": self.best_metric,
            "bad_validations": self.bad_validations,
            "train_tokens": self.train_tokens,
            "train_time": self.train_time,
            "wall_time": self.wall_time(),
            "ema": ema,
            "routing": self.last_routing,
            "config": config_dict(self.cfg),
        }

    def load_state(
        self, model_state: dict[str, torch.Tensor], state: dict[str, Any], saved_as: Path | None = None
    ) -> None:
        """Restore weights and training state saved by :meth:`save` (every rank loads the same files);
        ``saved_as``: the checkpoint's stem, the newest finite one a divergence message names.

        A checkpoint written with a moving average restores the training weights from the state and
        the average from ``model_state``; turning ``train.ema_decay`` on at resume starts the average
        from the resumed weights, turning it off continues from the training weights.
        """
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
        self.sampler.load_state_dict(state["sampler"])
        ranks = state.get("rng_ranks") or [state["rng"]]  # a checkpoint that lacks it: rank 0's alone
        if self.dist.rank < len(ranks):
            set_rng_state(ranks[self.dist.rank])
        else:
            set_rng_state(state["rng"])
            warnings.warn(
                f"rank {self.dist.rank}: the checkpoint holds the random state of {len(ranks)} rank(s); this rank "
                "continues from rank 0's, so its dropout masks differ from those of an uninterrupted run",
                stacklevel=2,
            )
        self.update, self.epoch = int(state["update"]), int(state["epoch"])
        self.best_metric = state["best_metric"]
        self.bad_validations = int(state["bad_validations"])
        self.train_tokens, self.train_time = int(state["train_tokens"]), float(state["train_time"])
        self.wall_time_before = float(state.get("wall_time", 0.0))  # a checkpoint that lacks it counts 0
        self.last_routing = dict(state.get("routing") or {})  # a checkpoint that lacks it: none
        if saved_as is not None:
            self.last_saved = (saved_as, self.update)

    def wall_time(self) -> float:
        """Wall-clock seconds of the whole run: its earlier processes (until their last save) and this one."""
        return self.wall_time_before + (time.time() - self.started)

    def save(self, is_best: bool = False, numbered: bool = False) -> None:
        """Atomically write ``checkpoint_last`` (and best / numbered) on rank 0: full weights in
        safetensors, even under FSDP (where every rank takes part in gathering them).

        Raises:
            TrainingError: a non-finite loss, gradient norm or weight (nothing written; every rank raises).
        """
        self.divergence.check(self.last_saved)
        bad = nonfinite_weights(self.model, self.ema, self.parallel)
        if bad:
            raise TrainingError(
                divergence_message(f"non-finite weights ({', '.join(bad[:3])})", self.update, self.last_saved)
            )
        rng = self.rng_states()  # every rank's (a collective under torchrun)
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
            self.model = self.eval_model()

    def eval_model(self) -> nn.Module:
        """A model each rank can evaluate alone: the model itself, or under FSDP an unsharded copy
        loaded with the gathered weights (a collective: every rank calls it and gets its copy)."""
        if self.parallel.mode != "fsdp":
            return self.model
        weights = self.parallel.full_state_dict(every_rank=True)
        if self._replica is None:
            self._replica = self._build_model()
        self._replica.load_state_dict(weights, strict=True)
        return self._replica

    # ------------------------------------------------------------------ steps

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def micro_loss(self, batch: Batch) -> dict[str, torch.Tensor]:
        # through DDP / FSDP2 (or the bare model); the output layer is fused with the loss
        with self._autocast():
            return self.parallel(batch.net_input, batch.target)

    def _host_batches(self) -> Iterator[tuple[Batch, dict[str, int]]]:
        """This rank's training batches collated on the host (pinned for an accelerator), epoch
        after epoch from the sampler's saved position, each with the sampler's state after it."""
        epoch = self.epoch
        pin = self.device.type == "cuda"
        while True:
            self.sampler.set_epoch(epoch)  # keeps the saved position within the same epoch
            for indices in self.sampler:
                batch = collate(self.train_set, indices, self.arch, pad_to_multiple=self.pad_to_multiple)
                yield batch.pin_memory(training_only=True) if pin else batch, self.sampler.state_dict()
            epoch += 1

    def batches(self) -> Iterator[Batch]:
        """This rank's training batches on the device, collated ``train.prefetch`` batches ahead in a
        background thread (:class:`~transformer.data.prefetch.Prefetcher`) and copied without the
        host waiting (from pinned memory); the training tensors only. The trainer's epoch and data
        position follow the batches handed out, not the ones prepared."""
        non_blocking = self.device.type == "cuda"
        with Prefetcher(self._host_batches(), self.prefetch, device=self.device) as ahead:
            for batch, position in ahead:
                self.epoch, self._data_position = position["epoch"], position
                yield batch.to(self.device, non_blocking=non_blocking, training_only=True)

    @contextmanager
    def _compile_errors_named(self, first: bool) -> Iterator[None]:
        """Around this process's first update: a compiled step that fails to compile (an error of
        dynamo or inductor) stops the run with one line naming the error and the eager switch."""
        try:
            yield
        except Exception as err:
            if not (first and self.compiled and _compiler_error(err)):
                raise
            what = " ".join(str(err).split())[:300]
            raise TrainingError(
                f"train.compile: the training step failed to compile ({type(err).__name__}: {what}); "
                "train eagerly with train.compile=false"
            ) from err

    def _next_update(self, batches: Iterator[Batch]) -> tuple[list[Batch], int]:
        """The next update's ``train.update_freq`` micro-batches of ``batches`` (:meth:`batches`)
        and their target tokens over all ranks, counted on the host from the shared batch list."""
        micro, ntokens = [], 0
        for _ in range(self.cfg.train.update_freq):
            micro.append(next(batches))
            position = self.data_position()  # the batch just handed out: its epoch and 1-based position
            ntokens += self.sampler.step_tokens(position["epoch"], position["position"])
        return micro, ntokens

    def data_position(self) -> dict[str, int]:
        """``{"epoch", "position"}``: the batches of this rank handed to training so far (a
        checkpoint's resume point; the sampler itself may be ahead, preparing batches)."""
        return dict(self._data_position) if self._data_position is not None else self.sampler.state_dict()

    @property
    def epochs_done(self) -> int:
        """Complete passes over the training data (this rank's shard)."""
        position = self.data_position()
        finished = position["epoch"] == self.epoch and position["position"] >= len(self.sampler)
        return self.epoch - 1 + int(finished)

    def train_step(self, batches: list[Batch], ntokens: int | None = None) -> dict[str, Any]:
        """One update over ``update_freq`` micro-batches, reading nothing on the host.

        The summed loss of each micro-batch is scaled by
        :meth:`~transformer.training.distributed.parallel.DataParallel.loss_scale` before its backward
        pass, so the reduced gradients arrive divided by the update's target tokens over all ranks:
        no collective and no pass over the gradients after the backward pass but the engine's own
        reduction, the gradient norm (a clipping pass only with ``train.clip_norm > 0``) and the
        fused optimizer step.

        Args:
            batches: this rank's micro-batches of the update, on the device.
            ntokens: the update's target tokens over all ranks (``Trainer.fit`` takes it from
                :meth:`~transformer.data.batching.TokenBatchSampler.step_tokens`); None counts the
                batches' own (summed over the ranks by a collective under torchrun).

        Returns:
            The update's statistics as they stand on the device, for
            :func:`~transformer.training.step.update_stats.read_stats` (a host sync): ``loss_sum`` and
            ``nll_sum`` (fp64 sums over this rank's batches), ``local_tokens`` (this rank's target
            tokens, an int), ``ntokens`` (all ranks, an int), ``lr`` (a float), ``grad_norm``, and for
            a mixture of experts, which backpropagates ``router_loss`` too
            (:func:`~transformer.training.step.criterion.model_loss`), ``routing``
            (:meth:`RoutingMonitor.finish`: the selection biases then have moved).

        Raises:
            TrainingError: on the CPU of one process, when the loss or the gradient norm is not finite
                (names the update and the last finite checkpoint); on an accelerator or under torchrun
                that is found later, by :meth:`DivergenceWatch.check`. fp16 leaves overflowing
                gradients to the GradScaler.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        local_tokens = sum(b.ntokens for b in batches)
        if ntokens is None:
            ntokens = self.parallel.sum_over_ranks(local_tokens)
        scale = self.parallel.loss_scale(ntokens)
        loss_sum = nll_sum = torch.zeros(
            (), dtype=torch.float64, device=self.device
        )  # fp64, as the floats they replace
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
        self._routing = routing or self._routing
        if self.ema is not None:
            self.ema.update(self.model)
        with warnings.catch_warnings():
            # fp16: the GradScaler skips the optimizer step of an update whose gradients overflowed;
            # the update still counts and the schedule advances (torch warns about that order)
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        self.update += 1
        self.train_tokens += ntokens
        return dict(
            loss_sum=loss_sum,
            nll_sum=nll_sum,
            local_tokens=local_tokens,
            ntokens=ntokens,
            lr=lr,
            grad_norm=grad_norm,
            routing=routing,
        )

    # ------------------------------------------------------------------ evaluation

    def valid_loss(self, model: nn.Module | None = None) -> dict[str, float]:
        """Teacher-forced loss / nll / perplexity per target token on the validation pairs the model
        can score (:func:`~transformer.training.loop.validation.scorable_pairs`), of ``model`` (default:
        the trained model; see :meth:`eval_model`)."""
        model = self.model if model is None else model
        valid, note = self.valid_set
        if note:
            self.log(note)
            self.valid_set = (valid, None)
        return teacher_forced_loss(
            model,
            valid,
            self.criterion,
            arch=self.arch,
            max_tokens=self.cfg.train.max_tokens,
            device=self.device,
            autocast=self._autocast,
            features=self.features if model is self.model else None,
        )

    def bleu(
        self, split: str, subset: int = 0, hyp_file: Path | None = None, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """Translate ``split`` (its first ``subset`` pairs when set) with ``cfg.generation`` and
        ``model`` (default: the trained model) and score it against the raw references; see
        :func:`~transformer.training.loop.validation.translate_and_score` (every rank calls it under
        torchrun: each decodes its share, every rank gets the scores, rank 0 writes ``hyp_file``)."""
        dataset = self.data.splits[split]
        if subset and subset < len(dataset):
            dataset = dataset.subset(range(subset))
        return translate_and_score(
            self.model if model is None else model,
            dataset,
            self.data.tgt_tokenizer,
            self.cfg.generation,
            self.device,
            split=split,
            tokenize=self.cfg.data.bleu_tokenize,
            lowercase=self.cfg.data.lowercase,
            progress=bool(self.cfg.train.progress),
            log=self.log,
            hyp_file=hyp_file,
            precision=self.precision,  # an accelerator decodes in the run's precision (the CPU in fp32)
            dist_info=self.dist,  # under torchrun each rank decodes its share of the batches
        )

    def validate(self, logger: Any) -> bool:
        """One validation round: the validation loss of the trained model, or of its moving average
        when on, on rank 0 (broadcast, so that every rank takes the same best and patience
        decisions), and with ``train.valid_bleu`` BLEU/chrF decoded by all ranks together (under
        FSDP the weights are gathered on every rank); ``best_metric`` / ``bad_validations``
        updated; the metrics logged (``logger.log(metrics, step, split="valid")``) with a line on
        rank 0. Every rank calls it.

        Returns:
            True when this is the best result so far (``bleu``, higher is better, when
            ``train.best_metric=bleu`` and BLEU was computed; else the loss, lower is better).
        """
        self.memory.enter("validation")
        try:
            t = self.cfg.train
            metrics: dict[str, Any] = {}
            model = self.eval_model()  # FSDP: gathers the weights (every rank)
            with self.ema.swapped(model) if self.ema is not None else nullcontext():
                if self.dist.is_main:
                    metrics = self.valid_loss(model)
                metrics = broadcast_from_main(metrics, self.dist)  # every rank takes the same best/patience decisions
                if t.valid_bleu:  # decoded by every rank, the same scores on each
                    scores = self.bleu("valid", subset=t.valid_bleu_subset, model=model)
                    metrics.update(bleu=scores["bleu"], chrf=scores["chrf"])
            if t.best_metric == "bleu" and "bleu" in metrics:
                value, better = metrics["bleu"], lambda a, b: a > b
            else:
                value, better = metrics["loss"], lambda a, b: a < b
            is_best = self.best_metric is None or better(value, self.best_metric)
            if is_best:
                self.best_metric, self.bad_validations = value, 0
            else:
                self.bad_validations += 1
            metrics["best"] = self.best_metric
            logger.log(metrics, step=self.update, split="valid")
            if self.dist.is_main:
                shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float))
                self.log(f"[valid] update {self.update}: {shown}")
            return is_best
        finally:
            self.memory.enter("training")

    # ------------------------------------------------------------------ the loop

    def stop_reason(self, train_time: float | None = None) -> str | None:
        """Why training stops now (a sentence naming the ``train.*`` limit reached), or None; see
        :func:`~transformer.training.stopping.budget_reached`. ``train_time``: the training seconds
        to judge the time budget by (default: :attr:`train_time`, the run's clock at the last
        meeting of the ranks)."""
        return budget_reached(
            self.cfg.train,
            update=self.update,
            epochs_done=self.epochs_done,
            train_time=self.train_time if train_time is None else train_time,
            bad_validations=self.bad_validations,
        )

    def _signal_received(self) -> bool:
        return self.stopping is not None and self.stopping.requested

    def _meet(self) -> bool:
        """A point every rank reaches at the same update (a logged, validated or saved update, or the
        last): the wall time since the last one, the device's queued work included, is added to
        :attr:`train_time`, then under torchrun the ranks agree on one clock (the slowest's) and on
        whether any received a stop signal (one collective,
        :meth:`~transformer.training.distributed.parallel.DataParallel.agree`). Returns whether a
        stop signal arrived."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the updates' device work is training time too
        now = time.time()
        self.train_time += now - self._clock_start
        self._clock_start = now
        self.train_time, signalled = self.parallel.agree(self.train_time, self._signal_received())
        return signalled

    def fit(self, logger: Any, stopping: GracefulStop | None = None) -> str:
        """Train until a ``train.*`` limit is reached: updates of ``update_freq`` micro-batches,
        training metrics every ``log_every`` updates, validation every ``validate_every`` (and at
        the end), checkpoints after each validation and every ``save_every`` updates. The host reads
        the device's losses, counts and finiteness state only at those points; the progress bar
        shows the last logged update's values.

        Every stop is decided alike on every rank. Update and epoch limits are the same on every
        rank by construction (every rank has as many batches per epoch), and patience follows rank
        0's broadcast validation. The time budget and stop signals are decided where the ranks meet
        anyway, at the updates they log, validate or save (:meth:`_meet`): one process judges them
        after every update; under torchrun they hold within ``train.log_every`` updates, and a quiet
        update makes no collective beyond its gradients' and token counts' reductions.
        :attr:`train_time` is wall time between those points without validation and saving, so it
        counts the device's work.

        Args:
            logger: a :class:`~transformer.training.monitoring.loggers.MetricsLogger` (``log(metrics, step, split)``).
            stopping: the run's :class:`~transformer.training.stopping.GracefulStop` (the polite stop
                on ``train.stop_signals``), or None.

        Returns:
            The reason training stopped (see :meth:`stop_reason`).

        Raises:
            TrainingError: on a non-finite loss or gradient norm (the last good checkpoint stays; on
                an accelerator found up to ``log_every`` updates later, see
                :class:`~transformer.training.step.divergence.DivergenceWatch`).
            StopRequested: a stop signal, after saving ``checkpoint_last``.
        """
        t = self.cfg.train
        self.stopping = stopping
        one_process = self.parallel.mode == "none"
        progress = TrainingBar(
            max_updates=t.max_updates,
            max_time=time_budget(t),
            update=self.update,
            train_time=self.train_time,
            desc=f"train {self.precision}",
            enabled=self.dist.is_main and bool(t.progress),
        )
        batches = self.batches()
        first_update = self.update  # the update this process compiles its step at (train.compile)
        self.memory.enter("training")
        stop = self.stop_reason()
        # target tokens since the last log (a device tensor off the eager CPU path) and the training
        # seconds they took
        window_tokens, logged_time, shown = 0, self.train_time, {"loss": "-", "tok_s": "-"}
        self._clock_start = time.time()
        try:
            while stop is None:
                step_start = time.time()
                with self._compile_errors_named(first=self.update == first_update):
                    stats = self.train_step(*self._next_update(batches))
                window_tokens = window_tokens + stats["ntokens"]
                log_now = self.update % t.log_every == 0 or self.update == 1
                validate_now = t.validate_every > 0 and self.update % t.validate_every == 0
                save_now = t.save_every > 0 and self.update % t.save_every == 0
                meet = log_now or validate_now or save_now
                if not meet and one_process:  # the time budget and a signal after every update
                    clock = self.train_time + (time.time() - self._clock_start)
                    meet = self.stop_reason(clock) is not None or self._signal_received()
                elif not meet:  # the limits every rank reaches at the same update
                    meet = self.stop_reason() is not None
                signalled = self._meet() if meet else False
                stop = self.stop_reason() if meet else None
                if log_now or stop is not None:  # and the last update
                    self.divergence.check(self.last_saved)  # the host reads the device's state here
                    logged = self.read_stats(stats, window_tokens)
                    logged.update(
                        tokens_per_s=logged.pop("window_tokens") / max(self.train_time - logged_time, 1e-9),
                        epoch=self.epoch,
                        ppl=perplexity(logged["nll_loss"]),
                    )
                    logger.log(logged, step=self.update, split="train")
                    window_tokens, logged_time = 0, self.train_time
                    shown = {"loss": f"{logged['loss']:.3f}", "tok_s": f"{logged['tokens_per_s']:.0f}"}
                # the last logged loss and tokens/s (reading every update's would stall an accelerator)
                progress.step(
                    time.time() - step_start,
                    self.update,
                    loss=shown["loss"],
                    lr=f"{stats['lr']:.2e}",
                    tok_s=shown["tok_s"],
                )
                if validate_now or stop is not None:
                    self.divergence.check(self.last_saved)
                    is_best = self.validate(logger)
                    stop = self.stop_reason()
                    # the end of training is a numbered checkpoint when the test averages them, so the
                    # tested weights include the last updates (a budget's or a resume's end off the grid)
                    self.save(
                        is_best=is_best,
                        numbered=save_now or (stop is not None and t.average_last > 0 and t.save_every > 0),
                    )
                elif save_now:
                    self.save(numbered=True)
                if meet:
                    self._clock_start = time.time()  # validating and saving are not training time
                if signalled or (one_process and self._signal_received()):
                    if stop is None:
                        stop_on_signal(self)
                    self.log(f"a stop signal arrived at update {self.update}, where training stops anyway: {stop}")
        finally:
            batches.close()  # stops the prefetching thread
            progress.close()
        return stop

    def progress(self) -> dict[str, Any]:
        """The run's counters as recorded in ``results.json``; ``routing``: a mixture of experts'
        metrics of the last update (:meth:`RoutingMonitor.finish`; ``{}`` for a dense model)."""
        return {
            "updates": self.update,
            "epochs": self.epoch,
            "best_valid": self.best_metric,
            "train_time_s": self.train_time,
            "train_tokens": self.train_tokens,
            "precision": self.precision,
            "world_size": self.dist.world_size,
            "peak_memory_mb_by_phase": self.memory.as_dict(),
            "routing": self.last_routing,
        }
