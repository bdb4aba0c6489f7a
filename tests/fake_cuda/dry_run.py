"""The dry run itself: the project's trainer, checkpoints and decoding on fake ``cuda:0`` tensors.

Imported by :mod:`tests.fake_cuda.runner` once the stand-in CUDA backend is loaded. Every check
drives the project's own functions as ``scripts/train.py`` runs them on ``train.device=cuda``
(:func:`run`):

* **update**: :class:`~transformer.training.loop.trainer.Trainer` built as the run builds it (the
  model built on the CPU by ``Trainer._build_model``, then moved: see
  :meth:`~tests.fake_cuda.harness.FakeCuda.to_device`), then one :meth:`Trainer.train_step` over
  ``train.update_freq`` batches of :meth:`Trainer.batches` (with ``train.prefetch=auto``: collated
  and pinned ahead in the prefetching thread, copied by ``Batch.to`` with ``non_blocking``; every
  copy of a batch tensor to the device is counted, :func:`copy_counts`): autocast, the
  label-smoothed loss through the fused output layer, router losses, backward (through the
  GradScaler under fp16), unscale, gradient clipping, the fused optimizer step, the schedule, the
  moving average, the MoE bias update. Afterwards every parameter, gradient,
  buffer, table, optimizer state, moving average and scaler tensor must be on ``cuda:0``, the
  gradients fp32, the optimizer fused, the GradScaler on exactly under fp16;
* **fit**: :meth:`Trainer.fit` itself instead, stopped by its time budget after one update, so that
  it validates (loss; BLEU by beam search; the moving average swapped in) and saves
  ``checkpoint_last`` (the writers given zeros of the saved shapes, the GPU tensors recorded as
  ``cuda:0`` in the ``.pt`` file as a GPU writes them: :class:`_GpuFiles`);
* **resume**: that checkpoint read on the host with ``load_checkpoint(map_location="cpu")`` (every
  tensor on the CPU; the file refuses to load without ``map_location`` on this CPU-only machine),
  then ``Trainer.load_state`` into a new fake-GPU trainer and one more update;
* **decoding**: greedy and beam search through :func:`~transformer.generation.translate_sentences`
  (what validation BLEU and the test call), with the host syncs answered as
  :mod:`tests.fake_cuda.harness` describes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from tests.fake_cuda.harness import CUDA, PROJECT, FakeCuda, module_tensors, off_device, trainer_tensors
from transformer.config import GenerationConfig, config_dict, register_configs, to_config, validate_config
from transformer.data.dataset import ParallelDataset, TranslationData
from transformer.generation import translate_sentences
from transformer.training.checkpoint import load_checkpoint
from transformer.training.distributed import setup_distributed
from transformer.training.loop.trainer import Trainer

CONFIGS = Path(PROJECT).parent / "configs"
VOCAB = 48


class StubTokenizer:
    """A vocabulary of ``size`` ids (the trainer reads its length; BLEU would decode ids as words)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


def synthetic_data(seed: int = 0) -> TranslationData:
    """A joint-vocabulary corpus of 24 training and 4 validation pairs of 2-6 random ids (no specials)."""
    rng = random.Random(seed)

    def side(n: int) -> list[list[int]]:
        return [[rng.randrange(5, VOCAB) for _ in range(rng.randrange(2, 7))] for _ in range(n)]

    tok = StubTokenizer(VOCAB)
    valid_src, valid_tgt = side(4), side(4)
    splits = {
        "train": ParallelDataset(side(24), side(24), None, None, "train"),
        "valid": ParallelDataset(
            valid_src, valid_tgt, [tok.decode(s) for s in valid_src], [tok.decode(s) for s in valid_tgt], "valid"
        ),
    }
    return TranslationData(src_tokenizer=tok, tgt_tokenizer=tok, splits=splits)


def compose_config(overrides: list[str], run_dir: Path) -> Any:
    """The validated :class:`~transformer.config.Config` of ``configs/train.yaml`` with ``overrides``."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*overrides, f"run_dir={run_dir}"])
    validate_config(cfg)
    return to_config(cfg)


def with_precision(cfg: Any, precision: str) -> Any:
    """``cfg`` with ``train.precision=precision``."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))


def build_trainer(fc: FakeCuda, cfg: Any, data: TranslationData, run_dir: Path) -> Trainer:
    """``Trainer(cfg, data, setup_distributed(cfg.train.device), run_dir)`` inside ``fc``, as
    ``transformer.training.job.run.train`` builds it (``train.device=cuda``: rank 0 of 1 on ``cuda:0``);
    ``Trainer._build_model`` builds the model on the CPU (real tensors, the project's init), which
    ``fc`` then moves as ``.to(device)`` would."""
    build = Trainer._build_model

    def build_then_move(self: Trainer) -> torch.nn.Module:
        with unset_fake_temporarily(), mock.patch.object(self, "device", torch.device("cpu")):
            model = build(self)
        return fc.to_device(model, self.device)

    dist_info = setup_distributed(cfg.train.device)
    if dist_info.device != CUDA:
        raise AssertionError(f"train.device={cfg.train.device} resolved to {dist_info.device}, not {CUDA}")
    with mock.patch.object(Trainer, "_build_model", build_then_move):
        return Trainer(cfg, data, dist_info, run_dir)


def failure(err: BaseException) -> str:
    """``Type: message (at the innermost project line)`` of an exception."""
    where = [f for f in traceback.extract_tb(err.__traceback__) if f.filename.startswith(PROJECT)]
    at = ""
    if where:
        at = f" (at {Path(where[-1].filename).relative_to(Path(PROJECT).parent)}:{where[-1].lineno} {where[-1].name})"
    message = " ".join(str(err).split())[:600]
    return f"{type(err).__name__}: {message}{at}"


def placement(result: dict[str, Any], named: Any, fc: FakeCuda, when: str) -> None:
    """Add the tensors of ``named`` that are off ``cuda:0`` to ``result``'s problems (or notes)."""
    problems, notes = off_device(named, fc.host)
    result["problems"] += [f"off cuda:0 {when}: {p}" for p in problems]
    result.setdefault("notes", [])
    result["notes"] += [n for n in (f"off cuda:0 {when}: {n}" for n in notes) if n not in result["notes"]]


def step_checks(trainer: Trainer, precision: str, updates: int = 1) -> list[str]:
    """What must hold after one update on the GPU besides placement (empty when all does)."""
    problems = []
    if trainer.precision != precision:
        problems.append(f"precision {trainer.precision}, expected {precision}")
    if not all(g.get("fused") for g in trainer.optimizer.param_groups):
        problems.append("the optimizer is not fused")
    if trainer.scaler.is_enabled() != (precision == "fp16"):
        problems.append(f"GradScaler enabled={trainer.scaler.is_enabled()} under {precision}")
    for name, p in trainer.model.named_parameters():
        if p.grad is None:
            problems.append(f"no gradient: {name}")
        elif p.grad.dtype != p.dtype:
            problems.append(f"gradient of {name} is {p.grad.dtype}, the parameter {p.dtype}")
    for state in trainer.optimizer.state.values():
        if "step" not in state:
            problems.append("optimizer state without step")
            break
    if trainer.update != updates or trainer.scheduler.last_epoch != updates:
        problems.append(f"update {trainer.update}, scheduler at {trainer.scheduler.last_epoch}, expected {updates}")
    return problems


def copy_counts(fc: FakeCuda) -> dict[str, dict[str, int]]:
    """phase -> ``{"blocking", "pageable", "async"}``: the copies of batch tensors (a ``Batch``'s
    ``net_input`` and ``target`` made on the host) to the device. ``blocking``: the host waits for the
    copy (no ``non_blocking``); ``pageable``: from memory that is not pinned (the device's stream
    waits for the host's staging copy); ``async``: neither. A copy may count as blocking and pageable."""
    out: dict[str, dict[str, int]] = {}
    for c in fc.host.copies:
        if not c.batch:
            continue
        counts = out.setdefault(c.phase, {"blocking": 0, "pageable": 0, "async": 0})
        counts["blocking"] += not c.non_blocking
        counts["pageable"] += not c.pinned
        counts["async"] += c.non_blocking and c.pinned
    return out


def copy_sites(fc: FakeCuda) -> dict[str, dict[str, int]]:
    """phase -> ``"batch|other blocking|non_blocking pinned|pageable at site" -> count`` of every
    copy of a host tensor to the device (what :func:`copy_counts` counts, and the rest)."""
    out: dict[str, dict[str, int]] = {}
    for c in fc.host.copies:
        key = (
            f"{'batch' if c.batch else 'other'} {'non_blocking' if c.non_blocking else 'blocking'}"
            f" {'pinned' if c.pinned else 'pageable'} at {c.site}"
        )
        out.setdefault(c.phase, {})
        out[c.phase][key] = out[c.phase].get(key, 0) + 1
    return out


PREFETCH_THREAD = "batch-prefetch"
"""The name of :class:`~transformer.data.prefetch.Prefetcher`'s thread."""


def prefetching(result: dict[str, Any], when: str) -> None:
    """A prefetching thread still alive ``when`` is a problem of ``result`` (the loop must stop it)."""
    alive = [t for t in threading.enumerate() if t.name == PREFETCH_THREAD and t.is_alive()]
    if alive:
        result["problems"].append(f"{len(alive)} prefetching thread(s) still running {when}")


def train_step_on_gpu(trainer: Trainer, updates: int = 1) -> None:
    """``updates`` of ``Trainer.train_step`` over ``train.update_freq`` batches each of one
    ``Trainer.batches()`` (as ``Trainer.fit`` takes them), which is then closed (its prefetching
    thread stopped, as ``fit`` does at its end)."""
    batches = trainer.batches()
    try:
        for _ in range(updates):
            trainer.train_step([next(batches) for _ in range(trainer.cfg.train.update_freq)])
    finally:
        batches.close()


def host_syncs(fc: FakeCuda) -> dict[str, dict[str, int]]:
    """phase -> ``"kind at site: source line" -> count`` of the host syncs recorded."""
    out: dict[str, dict[str, int]] = {}
    for s in fc.syncs():
        key = f"{s.kind} at {s.site}: {s.text}"
        out.setdefault(s.phase, {})
        out[s.phase][key] = out[s.phase].get(key, 0) + 1
    return out


def run(
    cfg: Any, precision: str, data: TranslationData, *, fit: bool = False, resume: bool = False, decode: bool = False
) -> dict[str, Any]:
    """One case in one precision on the fake GPU.

    Without ``fit``: one ``Trainer.train_step`` over ``train.update_freq`` batches of
    ``Trainer.batches``. With ``fit``: ``Trainer.fit`` itself, stopped after its first update by
    ``train.max_time`` (so it also validates, BLEU by beam search included, and saves
    ``checkpoint_last`` through :class:`_GpuFiles`, as the loop does at its last update), with a
    moving average (``train.ema_decay=0.99`` unless set). Then the
    checks (:func:`placement`, :func:`step_checks`); with ``resume`` the checkpoint round trip
    (:func:`resume_on_gpu`); with ``decode`` greedy and beam search (:func:`decode_valid`).

    Returns:
        ``ok``, ``problems`` (what does not hold), ``notes``, ``error`` (the first exception: type,
        message and the innermost project line), ``syncs`` (phase -> host syncs), ``ops`` (phase ->
        operators dispatched), ``copies`` (phase -> batch copies to the device, :func:`copy_counts`),
        ``copy_sites`` (:func:`copy_sites`), ``prefetch`` (the trainer's ``train.prefetch``),
        ``pinned_by`` (thread name -> tensors pinned there), ``seconds``, and what ``fit`` and
        ``resume`` saw. Validation inside ``fit`` is phase ``validate``.
    """
    start = time.time()
    result: dict[str, Any] = {"ok": False, "problems": [], "notes": [], "error": None, "syncs": {}, "ops": {}}
    result.update(copies={}, copy_sites={}, prefetch=None, pinned_by={})
    cfg = with_precision(cfg, precision)
    with tempfile.TemporaryDirectory() as tmp:
        # fit: stop after the first update; with a moving average (validated swapped in, saved as the weights)
        train = (
            dataclasses.replace(cfg.train, max_time=1e-6, ema_decay=cfg.train.ema_decay or 0.99) if fit else cfg.train
        )
        cfg = dataclasses.replace(cfg, run_dir=tmp, train=train)
        fc = FakeCuda()
        try:
            with fc:
                trainer = build_trainer(fc, cfg, data, Path(tmp))
                result["prefetch"] = trainer.prefetch
                if fit:
                    fc.phase("fit")
                    fit_on_gpu(fc, trainer, result)
                else:
                    fc.phase("train_step")
                    train_step_on_gpu(trainer)
                prefetching(result, "after the update")
                placement(result, trainer_tensors(trainer), fc, "after the update")
                result["problems"] += step_checks(trainer, precision)
                if decode:
                    decode_valid(fc, trainer, data, result)
            if resume:
                resume_on_gpu(cfg, data, Path(tmp), result)
        except Exception as err:  # noqa: BLE001 - reported per case
            result["error"] = failure(err)
        result["syncs"], result["ops"] = host_syncs(fc), dict(fc.host.ops)
        result["copies"].update(copy_counts(fc))  # beside those of the resumed trainer's
        result["copy_sites"].update(copy_sites(fc))
        result["pinned_by"] = dict(fc.host.pinned_by)
    result["ok"] = result["error"] is None and not result["problems"]
    result["seconds"] = round(time.time() - start, 2)
    return result


class _Metrics:
    """A metrics logger that keeps what it is given (``MetricsLogger.log``)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def log(self, metrics: Any, step: int, split: str) -> None:
        self.rows.append((split, dict(metrics)))


def fit_on_gpu(fc: FakeCuda, trainer: Trainer, result: dict[str, Any]) -> None:
    """``Trainer.fit`` with the checkpoint writers of :class:`_GpuFiles`: one update, then (the time
    budget reached) validation (phase ``validate``: its batches are not training batches), with the
    moving average swapped in when there is one, and ``checkpoint_last``. A validation sentence that
    failed to translate (the trainer logs the error and goes on) is a problem."""
    logged: list[str] = []
    trainer.log = trainer.validator.log = logged.append
    validate = trainer.validate

    def validate_phase(logger: Any) -> bool:
        fc.phase("validate")
        try:
            return validate(logger)
        finally:
            fc.phase("fit")

    trainer.validate = validate_phase
    metrics = _Metrics()
    _FILES.saved.clear()
    with contextlib.ExitStack() as stack:
        for patch in _FILES.patches():
            stack.enter_context(patch)
        # weights_for_safetensors reads storage pointers, which fake tensors lack (torch warns)
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        result["stopped"] = trainer.fit(metrics)
    result["logged"] = {split: sorted(row) for split, row in metrics.rows}
    result["problems"] += [f"validation: {line}" for line in logged if "could not be translated" in line]
    result["saved_on_cuda"] = sum(s.endswith(" cuda:0") for s in _FILES.saved)
    result["saved_tensors"] = len(_FILES.saved)


# ----------------------------------------------------------------------------- checkpoints


class _GpuFiles:
    """While active, the checkpoint writers get real zeros of the shapes they are given; a tensor that
    was on the (fake) GPU keeps ``cuda:0`` as its location in ``torch.save`` files."""

    def __init__(self) -> None:
        self.saved: list[str] = []  # "file: name device" of every tensor handed to a writer
        self.cuda_storages: set[int] = set()

    def materialise(self, obj: Any, path: str, where: str = "") -> Any:
        if isinstance(obj, Tensor):
            self.saved.append(f"{Path(path).name}: {where} {obj.device}")
            if isinstance(obj, FakeTensor):
                with unset_fake_temporarily():
                    real = torch.zeros(obj.shape, dtype=obj.dtype)
                if obj.device.type == "cuda":
                    self.cuda_storages.add(real.untyped_storage().data_ptr())
                return real
            return obj
        if isinstance(obj, dict):
            return {k: self.materialise(v, path, f"{where}.{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.materialise(v, path, f"{where}[{i}]") for i, v in enumerate(obj))
        return obj

    def tag(self, storage: Any) -> str | None:
        """``torch.serialization`` tagger: ``cuda:0`` for the zeros standing for GPU tensors."""
        return "cuda:0" if storage.data_ptr() in self.cuda_storages else None

    def patches(self) -> list[Any]:
        save, save_file = torch.save, __import__("transformer.runs.io", fromlist=["save_file"]).save_file

        def torch_save(obj: Any, f: Any, *a: Any, **k: Any) -> None:
            with unset_fake_temporarily():
                save(self.materialise(obj, str(f)), f, *a, **k)

        def safetensors_save(tensors: dict[str, Tensor], filename: str, metadata: Any = None) -> None:
            with unset_fake_temporarily():
                save_file(self.materialise(tensors, filename), filename, metadata=metadata)

        return [mock.patch("torch.save", torch_save), mock.patch("transformer.runs.io.save_file", safetensors_save)]


_FILES = _GpuFiles()
torch.serialization.register_package(0, _FILES.tag, lambda storage, location: None)


def resume_on_gpu(cfg: Any, data: TranslationData, run_dir: Path, result: dict[str, Any]) -> None:
    """Read ``checkpoint_last`` on the host with ``map_location="cpu"`` (as ``scripts/translate.py`` and
    a resume do), check every tensor is on the CPU and that the file needs that ``map_location``, then
    resume a new trainer on the fake GPU (``Trainer.load_state``) and take one more step."""
    model_state, state = load_checkpoint(run_dir, "checkpoint_last", map_location="cpu")
    stray = [f"{k}: {t.device}" for k, t in _tensors(model_state) + _tensors(state) if t.device.type != "cpu"]
    result["problems"] += [f"loaded off the CPU: {s}" for s in stray]
    try:
        torch.load(run_dir / "checkpoint_last.pt", weights_only=True)
        result["problems"].append(
            "checkpoint_last.pt loads without map_location: its GPU tensors were not saved as cuda"
        )
    except RuntimeError as err:
        result["without_map_location"] = " ".join(str(err).split())[:160]
    fc = FakeCuda()
    with fc:
        resumed = build_trainer(fc, cfg, data, run_dir)
        fc.phase("load_state")
        resumed.load_state(model_state, state)
        fc.phase("train_step after resume")
        train_step_on_gpu(resumed)
        prefetching(result, "after resuming")
        placement(result, trainer_tensors(resumed), fc, "after resuming")
        result["problems"] += [p for p in step_checks(resumed, cfg.train.precision, updates=2)]
    result["resume_syncs"] = {"load_state": {}, "train_step after resume": {}, **host_syncs(fc)}  # both ran
    result["copies"].update(copy_counts(fc))
    result["copy_sites"].update(copy_sites(fc))


def _tensors(obj: Any, where: str = "") -> list[tuple[str, Tensor]]:
    if isinstance(obj, Tensor):
        return [(where, obj)]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _tensors(v, f"{where}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [x for i, v in enumerate(obj) for x in _tensors(v, f"{where}[{i}]")]
    return []


# ----------------------------------------------------------------------------- decoding


def decode_valid(fc: FakeCuda, trainer: Trainer, data: TranslationData, result: dict[str, Any]) -> None:
    """Greedy and beam search (beam 2, at most one token before EOS) of two validation sentences on the fake GPU,
    through :func:`~transformer.generation.translate_sentences` (what validation BLEU and the test call)."""
    src = data.splits["valid"].src[:2]
    model = trainer.model
    for strategy in ("greedy", "beam"):
        fc.phase(strategy)
        fc.host.calls.clear()  # the answers to a search's reads count from its start
        gen = GenerationConfig(strategy=strategy, beam_size=2, max_len_a=0.0, max_len_b=1)
        marks: list[int] = []  # host syncs recorded so far, at each decode_step call
        counted = _counting_decode_step(model, fc, marks)

        start = len(fc.host.syncs)
        with mock.patch.object(model, "decode_step", counted):
            hyps = translate_sentences(model, src, gen, trainer.device)
        result.setdefault("decode_steps", {})[strategy] = len(marks)  # decode_step calls (one per generated token)
        # the loop's reads: those between the first decode_step call and the last, per step in between
        per_step = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else float("nan")
        result.setdefault("decode_syncs", {})[strategy] = {
            "per_step": per_step,
            "per_search": len(fc.host.syncs) - start - per_step * len(marks),
        }
        if len(hyps) != len(src) or not all(hyps):
            result["problems"].append(f"{strategy}: {sum(map(bool, hyps))} of {len(src)} sentences got a hypothesis")
    placement(result, module_tensors(trainer.model), fc, "after decoding")


# ----------------------------------------------------------------------------- the plan


INJECTIONS: dict[str, Callable[[], Any]] = {}


def inject_cpu_mask() -> Any:
    """A deliberate bug for the dry run to find: the stack's attention mask made on the CPU
    (``torch.ones`` without ``device=``) in every forward pass."""
    from dataclasses import replace

    from transformer.modules.attention_core import AttentionInputs

    prepare = AttentionInputs.prepare.__func__

    def prepare_with_cpu_mask(cls, position, q_positions, k_positions=None, **kw):
        inputs = prepare(cls, position, q_positions, k_positions, **kw)
        q_len = q_positions.shape[1]
        k_len = q_len if k_positions is None else k_positions.shape[1]
        mask = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)[None, None]  # on the CPU
        return replace(inputs, mask=mask, is_causal=False)

    return mock.patch.object(AttentionInputs, "prepare", classmethod(prepare_with_cpu_mask))


INJECTIONS["cpu_mask"] = inject_cpu_mask

LAUNCH_PHASES = ("forward", "loss", "backward", "optimizer")
"""The phases of an update whose device operators :func:`launch_counts` counts: the model up to its
final hidden states (and the loss's scaling), the output layer fused with the loss, the backward
pass, everything after it (norm, optimizer, schedule)."""


def launch_counts(
    preset: str, precision: str, target_tokens: int, vocab: int, compile_step: str = "false"
) -> dict[str, Any]:
    """The aten operators one quiet eager update dispatches on the device, by phase
    (:data:`LAUNCH_PHASES`): ``model=preset`` in ``precision`` on fake ``cuda:0``, one batch of
    ``target_tokens`` target tokens (rows of 127 target and 127 source ids) over a ``vocab``-id joint
    vocabulary, the update after a first one (the optimizer's state then exists). Each operator
    that meets a device tensor is one kernel launch at most (views launch none): an upper bound.

    Returns:
        ``{"phases": {phase: {operator: count}}, "compiled": whether ``train.compile=compile_step``
        compiled the step on this device, "error": None or the first exception}``.
    """
    from transformer.data.collate import collate_encoder_decoder
    from transformer.training.step import criterion

    rows = target_tokens // 128
    rng = random.Random(0)
    src = [[rng.randrange(5, vocab) for _ in range(127)] for _ in range(rows)]
    tgt = [[rng.randrange(5, vocab) for _ in range(127)] for _ in range(rows)]
    tok = StubTokenizer(vocab)
    train = ParallelDataset(src[:4], tgt[:4], None, None, "train")
    valid = ParallelDataset(src[:2], tgt[:2], ["a", "b"], ["a", "b"], "valid")
    data = TranslationData(src_tokenizer=tok, tgt_tokenizer=tok, splits={"train": train, "valid": valid})
    out: dict[str, Any] = {"phases": {}, "compiled": None, "error": None}
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"model={preset}",
            "train.device=cuda",
            f"train.precision={precision}",
            f"train.compile={compile_step}",
        ]
        cfg = compose_config([*overrides, "train.progress=false", "train.max_updates=10"], Path(tmp))
        fc = FakeCuda()
        try:
            with fc:
                trainer = build_trainer(fc, cfg, data, Path(tmp))
                out["compiled"] = trainer.compiled
                if trainer.compiled:
                    return out
                batch = collate_encoder_decoder(src, tgt).to(CUDA, non_blocking=True, training_only=True)
                assert batch.ntokens == target_tokens
                trainer.train_step([batch])  # the first update makes the optimizer's state
                fused_loss = criterion.linear_label_smoothed_nll_loss
                backward = Tensor.backward

                def loss_phase(*args: Any, **kwargs: Any) -> Any:
                    fc.phase("loss")
                    try:
                        return fused_loss(*args, **kwargs)
                    finally:
                        fc.phase("forward")

                def backward_phase(self: Tensor, *args: Any, **kwargs: Any) -> Any:
                    fc.phase("backward")
                    try:
                        return backward(self, *args, **kwargs)
                    finally:
                        fc.phase("optimizer")

                with (
                    mock.patch.object(criterion, "linear_label_smoothed_nll_loss", loss_phase),
                    mock.patch.object(Tensor, "backward", backward_phase),
                ):
                    fc.phase("forward")
                    fc.host.launches.clear()
                    trainer.train_step([batch])
                    fc.phase("after")
        except Exception as err:  # noqa: BLE001 - reported
            out["error"] = failure(err)
        out["phases"] = {phase: dict(fc.host.launches.get(phase, {})) for phase in LAUNCH_PHASES}
    return out


def run_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """Run ``plan``: ``cases``, each ``{name, config, compose, precisions, fit, resume, decoding}`` (see
    :meth:`tests.fake_cuda.cases.Case.as_dict`) and optionally ``inject``, a key of
    :data:`INJECTIONS` applied while that case runs. Returns ``{"cases": {name: {"runs": {precision:
    run(...)}, "seconds": ...}}}`` (``error`` instead of ``runs`` for a case whose config fails)."""
    data = synthetic_data()
    out: dict[str, Any] = {"cases": {}, "launches": {}}
    for name, args in plan.get("launches", {}).items():
        out["launches"][name] = launch_counts(**args)
    for case in plan["cases"]:
        start = time.time()
        res: dict[str, Any] = {"runs": {}}
        out["cases"][case["name"]] = res
        try:
            cfg = case_config(case)
        except Exception as err:  # noqa: BLE001 - a case that does not compose fails alone
            res["error"] = failure(err)
            continue
        with INJECTIONS[case["inject"]]() if case.get("inject") else contextlib.nullcontext():
            for precision in case["precisions"]:
                res["runs"][precision] = run(
                    cfg,
                    precision,
                    data,
                    fit=precision in case.get("fit", ()),
                    resume=precision in case.get("resume", ()),
                    decode=precision in case.get("decoding", ()),
                )
        res["seconds"] = round(time.time() - start, 2)
    return out


def case_config(case: dict[str, Any]) -> Any:
    """The case's validated :class:`~transformer.config.Config`; for a preset, Hydra must compose the
    model the case describes (the cases are resolved without Hydra, see :mod:`tests.fake_cuda.cases`)."""
    cfg = to_config(case["config"])
    if case.get("compose"):
        register_configs()
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            composed = OmegaConf.to_container(
                compose(config_name="train", overrides=case["compose"]).model, resolve=True
            )
        expected = config_dict(cfg)["model"]
        if composed != expected:
            diff = {k: (expected.get(k), v) for k, v in composed.items() if expected.get(k) != v}
            raise AssertionError(
                f"Hydra composes another model than the case describes ({{field: (case, Hydra)}}): {diff}"
            )
    validate_config(cfg)
    return cfg


def _counting_decode_step(model: Any, fc: Any, marks: list[int]) -> Any:
    """``model.decode_step`` that appends the number of host syncs recorded so far to ``marks`` at
    each call (one call per generated token)."""
    step = type(model).decode_step

    def counted(*args: Any, **kwargs: Any) -> Any:
        marks.append(len(fc.host.syncs))
        return step(model, *args, **kwargs)

    return counted
