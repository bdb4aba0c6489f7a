"""One validation round of a training run (:meth:`~transformer.training.loop.trainer.Trainer.validate`
calls it): the validation loss (and BLEU/chrF with ``train.valid_bleu``) of the trained model, or of
its moving average when on, on rank 0; the same numbers on every rank; the best result and the
patience count (``train.best_metric``, ``train.patience``) updated; the metrics logged.

The function reads and sets the attributes :class:`ValidatedTrainer` names, so this module does not
import the trainer's (which imports this one), as :mod:`.train_state` does.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Protocol

from torch import nn

from transformer.config import Config
from transformer.training.distributed.process_group import DistInfo, broadcast_from_main
from transformer.training.step.ema import EMA

__all__ = ["ValidatedTrainer", "validation_round"]


class ValidatedTrainer(Protocol):
    """The attributes of a :class:`~transformer.training.loop.trainer.Trainer` that
    :func:`validation_round` reads (and sets: ``best_metric``, ``bad_validations``)."""

    cfg: Config
    dist: DistInfo
    ema: EMA | None
    update: int
    best_metric: float | None
    bad_validations: int
    log: Callable[[str], None]

    def eval_model(self) -> nn.Module | None: ...

    def valid_loss(self, model: nn.Module | None = None) -> dict[str, float]: ...

    def bleu(
        self, split: str, subset: int = 0, hyp_file: Any = None, model: nn.Module | None = None
    ) -> dict[str, Any]: ...


def validation_round(trainer: ValidatedTrainer, logger: Any) -> bool:
    """Score the trained model on the validation split (every rank calls it: under FSDP the weights
    are gathered, and rank 0's metrics are broadcast so that every rank takes the same best and
    patience decisions), update ``trainer.best_metric`` / ``trainer.bad_validations``, log the
    metrics (``logger.log(metrics, step, split="valid")``) and a line on rank 0.

    Returns:
        True when this is the best result so far (``bleu``, higher is better, when
        ``train.best_metric=bleu`` and BLEU was computed; else the loss, lower is better).
    """
    t = trainer.cfg.train
    metrics: dict[str, Any] = {}
    model = trainer.eval_model()  # FSDP: gathers the weights (every rank)
    if trainer.dist.is_main:
        with trainer.ema.swapped(model) if trainer.ema is not None else nullcontext():
            metrics = trainer.valid_loss(model)
            if t.valid_bleu:
                scores = trainer.bleu("valid", subset=t.valid_bleu_subset, model=model)
                metrics.update(bleu=scores["bleu"], chrf=scores["chrf"])
    metrics = broadcast_from_main(metrics, trainer.dist)  # every rank takes the same best/patience decisions
    if t.best_metric == "bleu" and "bleu" in metrics:
        value, better = metrics["bleu"], lambda a, b: a > b
    else:
        value, better = metrics["loss"], lambda a, b: a < b
    is_best = trainer.best_metric is None or better(value, trainer.best_metric)
    if is_best:
        trainer.best_metric, trainer.bad_validations = value, 0
    else:
        trainer.bad_validations += 1
    metrics["best"] = trainer.best_metric
    logger.log(metrics, step=trainer.update, split="valid")
    if trainer.dist.is_main:
        shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float))
        trainer.log(f"[valid] update {trainer.update}: {shown}")
    return is_best
