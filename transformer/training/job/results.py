"""The run folder of a training run: where it is, what Hydra chose, and the ``results.json`` record.

A run folder (Hydra's output dir, or ``run_dir`` when set) receives ``config.yaml``, the
SentencePiece model(s), ``metrics.jsonl``, the checkpoints, ``hyps/{split}.txt`` (and the references
scored against, ``hyps/{split}.ref``) and finally
``results.json`` (written atomically by :func:`write_results`), which the comparison tools read.

Every test number is reproducible from the folder: ``results.json``'s ``test_weights`` names the
weights file the test translated with (``checkpoint_avg.safetensors``, the average of the last
``train.average_last`` checkpoints, saved by :func:`load_final_weights`; else
``checkpoint_best.safetensors``), and ``checkpoint=RUN`` loads that file
(:func:`transformer.generation.find_checkpoint`).
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from transformer.config import Config, config_dict
from transformer.data.dataset import TranslationData
from transformer.models import forward_flops
from transformer.precision import describe_hardware
from transformer.runs.folder import BEST, references_file, weights_path
from transformer.runs.hydra_record import job_run_dir
from transformer.runs.io import atomic_write_text
from transformer.training.checkpoint import load_checkpoint, save_run_average
from transformer.training.distributed.process_group import broadcast_from_main, broadcast_weights

__all__ = [
    "build_results",
    "copy_tokenizers",
    "final_test",
    "load_final_weights",
    "peak_memory_mb",
    "RunLog",
    "run_dir_for",
    "run_name",
    "run_progress",
    "write_results",
]

# the config groups named in a run's display name (wandb / tensorboard), in this order
RUN_NAME_GROUPS = ("model", "model/norm", "model/ffn", "model/position", "model/attention", "data", "experiment")


def run_dir_for(cfg: Config) -> Path:
    """The run folder: ``cfg.run_dir`` when set, else Hydra's output dir, else a dated folder under
    ``outputs/{experiment_name}`` (outside Hydra: tests, notebooks)."""
    if cfg.run_dir:
        return Path(cfg.run_dir)
    return job_run_dir() or Path("outputs") / cfg.experiment_name / time.strftime("%Y-%m-%d_%H-%M-%S")


class RunLog:
    """The run's log: each line goes to stderr and is appended to ``run_dir / "train.log"``.

    Lines logged before :meth:`open` are kept and written then, so that nothing lands in the run
    folder before a resume has been checked. Only rank 0 logs.

    Args:
        run_dir: the run folder.
        enabled: False on the other ranks (then nothing is shown or written).
    """

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.path = Path(run_dir) / "train.log"
        self.enabled = enabled
        self._pending: list[str] | None = []

    def __call__(self, message: str) -> None:
        """Show ``message`` on stderr and append it to ``train.log`` (once opened)."""
        if not self.enabled:
            return
        print(message, file=sys.stderr, flush=True)
        if self._pending is not None:
            self._pending.append(message)
        else:
            self._append([message])

    def open(self) -> None:
        """Start writing ``train.log`` (appending: a resumed run continues it), pending lines first."""
        pending, self._pending = self._pending or [], None
        if self.enabled:
            self._append([time.strftime("# %Y-%m-%d %H:%M:%S run started"), *pending])

    def _append(self, lines: list[str]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))


def run_name(cfg: Config, choices: dict[str, str]) -> str:
    """A display name from the chosen groups and the seed (``model=transformer_tiny,ffn=relu,seed=1``)."""
    parts = [f"{k.split('/')[-1]}={choices[k]}" for k in RUN_NAME_GROUPS if k in choices]
    return ",".join(parts + [f"seed={cfg.seed}"]) or f"{cfg.experiment_name}-seed{cfg.seed}"


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: allocated tensors on CUDA, the process's peak RSS elsewhere (Linux)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def copy_tokenizers(data: TranslationData, run_dir: Path) -> None:
    """Copy the SentencePiece model(s) into the run folder (``spm.model``, or ``spm.src.model`` +
    ``spm.tgt.model`` for separate vocabularies) so the run loads on its own."""
    if data.joint_vocab:
        shutil.copyfile(data.src_tokenizer.model_path, run_dir / "spm.model")
    else:
        shutil.copyfile(data.src_tokenizer.model_path, run_dir / "spm.src.model")
        shutil.copyfile(data.tgt_tokenizer.model_path, run_dir / "spm.tgt.model")


def build_results(
    cfg: Config,
    *,
    scores: dict[str, dict[str, Any]],
    test_split: str | None,
    final_model: str,
    params: int,
    flops_per_token: float,
    progress: dict[str, Any],
    device: torch.device,
    choices: dict[str, str],
    wall_time_s: float,
    active_params: int | None = None,
    test_weights: str | None = None,
    test_weights_updates: list[int] | None = None,
) -> dict[str, Any]:
    """The ``results.json`` record of a finished run.

    Args:
        cfg: the run's config (stored resolved under ``config``).
        scores: split -> :func:`~transformer.evaluation.metrics.corpus_scores` of the test splits.
        test_split: the split whose scores are the headline ``bleu`` / ``chrf`` (None: no test).
        final_model: which weights were tested (``checkpoint_best``, ``average of ...``, ``final``;
            ``... (EMA weights)`` when ``train.ema_decay > 0``).
        params: the model's parameter count.
        flops_per_token: forward FLOPs per target token (see :func:`~transformer.models.forward_flops`;
            for a mixture of experts, of the active experts).
        progress: the trainer's counters: ``updates``, ``epochs``, ``best_valid``, ``train_time_s``,
            ``train_tokens``, ``precision``, ``world_size``, ``peak_memory_mb_by_phase``, and for a
            mixture of experts ``routing``: the last update's routing metrics, recorded as they are
            named in ``metrics.jsonl`` (``moe_tokens_per_expert``, ``moe_max_load``,
            ``moe_aux_loss``, ``moe_z_loss``, ``moe_dropped_tokens``; absent for a dense model).
        device: the training device.
        choices: Hydra's config-group choices (see :func:`transformer.runs.hydra_record.job_choices`).
        wall_time_s: wall-clock seconds of the whole run (its earlier processes, until their last
            save, and this one).
        active_params: the parameters one token uses (``count_parameters(model, active_only=True)``:
            fewer than ``params`` for a mixture of experts); None means ``params``.
        test_weights: the file in the run folder that holds the tested weights
            (``checkpoint_avg.safetensors``, ``checkpoint_best.safetensors``), recorded as
            ``test_weights``; None when they were never saved as such (``final``).
        test_weights_updates: the updates the tested weights were saved at, recorded with
            ``test_weights_note`` when they predate the last update (:func:`tested_updates_note`).

    Returns:
        The record (JSON-serialisable).
    """
    main = scores.get(test_split, {}) if test_split is not None else {}
    return {
        "bleu": main.get("bleu"),
        "chrf": main.get("chrf"),
        "sacrebleu_signature": main.get("bleu_signature"),
        "chrf_signature": main.get("chrf_signature"),
        "test_split": test_split,
        "test": scores,
        "final_model": final_model,
        "test_weights": test_weights,  # the file checkpoint=RUN loads: the weights of these scores
        "test_weights_updates": test_weights_updates,
        "test_weights_note": tested_updates_note(test_weights_updates or [], progress["updates"]),
        "ema_decay": cfg.train.ema_decay,
        "params": params,
        "active_params": params if active_params is None else active_params,
        "flops_per_token": flops_per_token,
        "updates": progress["updates"],
        "epochs": progress["epochs"],
        "best_valid": progress["best_valid"],
        "best_metric": cfg.train.best_metric,
        "wall_time_s": wall_time_s,  # the whole run, every resumed process included
        "train_time_s": progress["train_time_s"],
        "train_tokens": progress["train_tokens"],
        "train_tokens_per_s": progress["train_tokens"] / max(progress["train_time_s"], 1e-9),
        "peak_memory_mb": peak_memory_mb(device),
        "peak_memory_mb_by_phase": progress.get("peak_memory_mb_by_phase", {}),
        "device": str(device),
        "precision": progress["precision"],
        "hardware": describe_hardware(device),
        "world_size": progress["world_size"],
        **progress.get("routing", {}),  # MoE: the last update's tokens per expert, max load, router losses
        "choices": choices,
        "config": config_dict(cfg),
    }


def write_results(run_dir: Path, results: dict[str, Any]) -> Path:
    """Write ``results`` atomically to ``run_dir / "results.json"``; returns the path."""
    return atomic_write_text(run_dir / "results.json", json.dumps(results, indent=2) + "\n")


def load_final_weights(trainer: Any) -> tuple[str, str | None, list[int]]:
    """Load into ``trainer.model`` the weights the test uses: the average of the last
    ``train.average_last`` numbered checkpoints, first saved as ``checkpoint_avg.safetensors`` in
    the run folder (:func:`~transformer.training.checkpoint.save_run_average`), else
    ``checkpoint_best``, else keep the weights in memory.

    With ``train.ema_decay > 0`` the checkpoints hold the moving average, and "final" is the
    average in memory.

    Args:
        trainer: the :class:`~transformer.training.loop.trainer.Trainer` of the run.

    Returns:
        ``(which, file)``: which weights, ``"average of checkpoint_..., ..."``, ``"checkpoint_best"``
        or ``"final"``, followed by `` (EMA weights)`` when the moving average is on; and the name
        of the weights file in the run folder that holds exactly them (``results.json``'s
        ``test_weights``), None for ``"final"``; and the updates those weights were saved at (the
        averaged checkpoints', the best checkpoint's, or the last update).

    Raises:
        OSError: the average cannot be written (then nothing is loaded), and the errors of reading
            the checkpoints (:func:`~transformer.training.checkpoint.load_checkpoint`).
    """
    ema = getattr(trainer, "ema", None)
    which, weights_file, updates = _load_final_weights(trainer)
    return which + (" (EMA weights)" if ema is not None else ""), weights_file, updates


def _load_final_weights(trainer: Any) -> tuple[str, str | None, list[int]]:
    t = trainer.cfg.train
    numbered = trainer.checkpoints.numbered() if trainer.checkpoints is not None else []
    if t.average_last > 0 and numbered:
        chosen = numbered[-t.average_last :]
        model_config = config_dict(trainer.cfg).get("model")
        averaged, path = save_run_average(trainer.checkpoints.run_dir, chosen, model_config)
        trainer.model.load_state_dict(averaged, strict=True)
        updates = [int(p.name.rsplit("_", 1)[1]) for p in chosen]
        return f"average of {', '.join(p.name for p in chosen)}", path.name, updates
    best = trainer.checkpoints.best() if trainer.checkpoints is not None else None
    if best is not None:
        model_state, state = load_checkpoint(best.parent, best.name, map_location=trainer.device)
        trainer.model.load_state_dict(model_state, strict=True)
        return BEST, weights_path(best).name, [int(state["update"])]
    if getattr(trainer, "ema", None) is not None:
        trainer.model.load_state_dict(trainer.ema.state_dict(), strict=True)
    return "final", None, [trainer.update]


def run_progress(trainer: Any) -> dict[str, Any]:
    """A trainer's counters as ``results.json`` records them (``progress``); ``routing``: a mixture
    of experts' metrics of the last update (``{}`` for a dense model)."""
    return {
        "updates": trainer.update,
        "epochs": trainer.epoch,
        "best_valid": trainer.validator.best_metric,
        "train_time_s": trainer.state.train_time,
        "train_tokens": trainer.state.train_tokens,
        "precision": trainer.precision,
        "world_size": trainer.dist.world_size,
        "peak_memory_mb_by_phase": trainer.memory.as_dict(),
        "routing": trainer.routing.last,
    }


def tested_updates_note(updates: list[int], last: int) -> str | None:
    """A sentence when the tested weights predate the run's last update, e.g. ``the tested weights
    (checkpoint_best) come from update 1,500 of 2,557``; None when they include it."""
    if not updates or max(updates) >= last:
        return None
    at = ", ".join(f"{u:,}" for u in updates)
    return f"update{'s' if len(updates) > 1 else ''} {at} of {last:,}: the last {last - max(updates):,} not tested"


def final_test(
    trainer: Any, choices: dict[str, str], params: int, start: float, active_params: int | None = None
) -> dict[str, Any]:
    """Load the final weights (:func:`load_final_weights`), translate and score the test splits
    (hypotheses in ``hyps/{split}.txt``, the references they were scored against in ``hyps/{split}.ref``), and write ``results.json`` (:func:`build_results`), whose
    ``test_weights`` names the file that holds the tested weights.

    Args:
        trainer: the :class:`~transformer.training.loop.trainer.Trainer` of the run. Under torchrun
            every rank calls it: rank 0 loads the tested weights and sends them to the others, the
            ranks decode each split together, rank 0 writes the files.
        choices: Hydra's config-group choices, recorded in the results.
        params: the model's parameter count.
        start: ``time.time()`` when the run started.
        active_params: the parameters one token uses (mixture of experts; None: ``params``).

    Returns:
        The results record.
    """
    cfg = trainer.cfg
    log = getattr(trainer, "log", lambda msg: print(msg, file=sys.stderr, flush=True))
    dist_info = getattr(trainer, "dist", None)
    main = dist_info is None or dist_info.is_main
    memory = getattr(trainer, "memory", None)
    if memory is not None:
        memory.enter("test")
    final_model, test_weights, tested_updates = "final", None, [trainer.update]
    if main:
        try:
            final_model, test_weights, tested_updates = load_final_weights(trainer)
        except Exception as err:  # the training is done: test what is in memory rather than lose it
            final_model, test_weights, tested_updates = "final", None, [trainer.update]
            log(
                f"[test] cannot load the weights chosen for the test ({' '.join(str(err).split())}); "
                "testing the final weights instead"
            )
    if dist_info is not None and dist_info.world_size > 1:  # every rank decodes with rank 0's weights
        final_model, test_weights, tested_updates = broadcast_from_main(
            (final_model, test_weights, tested_updates), dist_info
        )
        broadcast_weights(trainer.model, dist_info)
    saved_at = ", ".join(f"{u:,}" for u in tested_updates)
    if test_weights is not None:
        log(
            f"[test] with {test_weights} ({final_model}, saved at update{'s' * (len(tested_updates) > 1)} "
            f"{saved_at}): what checkpoint={trainer.run_dir} loads"
        )
    older = tested_updates_note(tested_updates, trainer.update)
    if older is not None:
        log(f"[test] the tested weights ({final_model}) are from {older}")
    test_splits = [s for s in cfg.data.test_splits if s in trainer.data.splits] or [
        s for s in trainer.data.splits if s not in ("train", "valid")
    ][:1]
    scores = {}
    for split in test_splits:
        try:
            hyp_file = trainer.run_dir / "hyps" / f"{split}.txt"
            scores[split] = trainer.validator.bleu(trainer.model, split, hyp_file=hyp_file)
            if main:  # the references beside the hypotheses: compare.py tests the run without its data
                references = "".join(r + "\n" for r in trainer.data.splits[split].tgt_text)
                atomic_write_text(references_file(hyp_file), references)
        except Exception as err:  # one split's failure never throws away the training or the other splits
            scores[split] = {"error": f"{type(err).__name__}: {' '.join(str(err).split())}"}
            log(f"[test] {split}: failed ({scores[split]['error']}); results.json records the error")
            continue
        log(f"[test] {split}: BLEU {scores[split]['bleu']:.2f} chrF {scores[split]['chrf']:.2f} ({final_model})")
    primary = cfg.data.test_prefix if cfg.data.test_prefix in scores else (test_splits[0] if test_splits else None)
    sample_len = 16
    flops = forward_flops(cfg.model, len(trainer.data.tgt_tokenizer), sample_len, sample_len)
    results = build_results(
        cfg,
        scores=scores,
        test_split=primary,
        final_model=final_model,
        params=params,
        flops_per_token=flops["per_target_token"],
        progress=run_progress(trainer),
        device=trainer.device,
        choices=choices,
        wall_time_s=trainer.state.wall_time() if hasattr(trainer, "state") else time.time() - start,
        active_params=active_params,
        test_weights=test_weights,
        test_weights_updates=tested_updates,
    )
    if main:
        write_results(trainer.run_dir, results)
    return results
