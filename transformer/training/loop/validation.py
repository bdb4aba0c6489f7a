"""Scoring a model during training: the :class:`Validator` (validation rounds, the best result,
patience), the teacher-forced loss per target token, and BLEU/chrF of a translated split."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer.config import Config, GenerationConfig, ModelConfig
from transformer.data.batching import TokenBatchSampler
from transformer.data.collate import collate
from transformer.data.tokenizer import Tokenizer
from transformer.evaluation.metrics import corpus_scores
from transformer.generation.translate import translate_dataset
from transformer.runs.io import atomic_write_text
from transformer.training.distributed.process_group import DistInfo, broadcast_from_main
from transformer.training.errors import TrainingError
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss, perplexity

__all__ = ["Validator", "scorable_pairs", "teacher_forced_loss", "translate_and_score"]


def scorable_pairs(valid: Any, model: ModelConfig) -> tuple[Any, str | None]:
    """The validation pairs whose loss the model can compute: with learned positions, the pairs
    that fit ``model.max_positions`` (the others are still translated for BLEU, and reported).

    Args:
        valid: the validation split (``src_lengths``, ``tgt_lengths``, ``subset``).
        model: the model config (``arch``, ``position.name``, ``max_positions``).

    Returns:
        ``(pairs, note)``: the split or the subset that fits, and a line to log once (None when
        every pair fits).

    Raises:
        TrainingError: no validation pair fits (before any training, naming the fields).
    """
    m = model
    if m.position.name != "learned":
        return valid, None
    fits = [
        s + t + 2 <= m.max_positions if m.arch == "decoder_only" else max(s, t) + 1 <= m.max_positions
        for s, t in zip(valid.src_lengths, valid.tgt_lengths)
    ]
    if all(fits):
        return valid, None
    keep = [i for i, ok in enumerate(fits) if ok]
    if not keep:
        raise TrainingError(
            f"none of the {len(fits)} validation pairs fits model.max_positions={m.max_positions} (learned "
            "positions), so the validation loss cannot be computed: raise model.max_positions or point "
            "data.valid_prefix at shorter pairs"
        )
    return valid.subset(keep), (
        f"[valid] loss over the {len(keep)} of {len(fits)} pairs that fit "
        f"model.max_positions={m.max_positions} (learned positions)"
    )


@torch.no_grad()
def teacher_forced_loss(
    model: nn.Module,
    dataset: Any,
    criterion: LabelSmoothedCrossEntropy,
    *,
    arch: str,
    max_tokens: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
    features: Callable[..., torch.Tensor] | None = None,
) -> dict[str, float]:
    """Teacher-forced loss / nll / perplexity per target token of ``model`` over ``dataset``, in
    eval mode (the model's mode is restored). The cross entropy only: a mixture of experts' router
    losses are training terms and are left out (:func:`~transformer.training.step.criterion.model_loss`).

    Args:
        model: an encoder-decoder or decoder-only model.
        dataset: the pairs (``src_lengths``, ``tgt_lengths``, indexable by :func:`collate`).
        criterion: the training loss.
        arch: ``model.arch`` (the batch format).
        max_tokens: tokens per batch.
        device: where the batches go.
        autocast: a context (the run's precision) around each forward.
        features: the model's (compiled) hidden-state function, or None for ``model.features``.

    Returns:
        ``{"loss", "nll_loss", "ppl"}`` per target token (base e).
    """
    was_training = model.training
    model.eval()
    sampler = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, max_tokens, arch=arch, shuffle=False)
    loss = nll = 0.0
    n = 0
    for indices in sampler:
        batch = collate(dataset, indices, arch).to(device)
        with autocast():
            out = model_loss(model, criterion, batch.net_input, batch.target, features=features)
        loss += out["loss"].item()
        nll += out["nll_loss"].item()
        n += int(out["ntokens"])
    model.train(was_training)
    return {"loss": loss / n, "nll_loss": nll / n, "ppl": perplexity(nll / n)}


def translate_and_score(
    model: nn.Module,
    dataset: Any,
    tgt_tokenizer: Tokenizer,
    generation: GenerationConfig,
    device: torch.device,
    *,
    split: str,
    tokenize: str,
    lowercase: bool,
    progress: bool,
    log: Callable[[str], None],
    hyp_file: Path | None = None,
    precision: str = "fp32",
    dist_info: Any = None,
) -> dict[str, Any]:
    """Translate ``dataset`` with ``generation`` and score it against its raw references.

    Under torchrun (``dist_info`` of several ranks) every rank calls it: each decodes its share of
    the batches one process would decode, the hypotheses are gathered in order on every rank, every
    rank scores them (the same numbers) and rank 0 alone writes ``hyp_file``: the same hypotheses
    and scores as one process, in a ``world_size``-th of the time.

    A sentence that cannot be translated (e.g. longer than learned positions) is reported through
    ``log``, left empty and listed (1-based) in ``failed_lines``; ``progress`` shows a bar of
    sentences on stderr.

    Args:
        model: the model to translate with.
        dataset: the split (``tgt_text`` holds the raw references).
        tgt_tokenizer: decodes the hypotheses.
        generation: the search settings.
        device: where the model runs.
        split: the split's name (progress bar, log lines).
        tokenize, lowercase: sacreBLEU's settings (``data.bleu_tokenize``, ``data.lowercase``).
        progress: show a progress bar.
        log: where a line about untranslatable sentences goes.
        hyp_file: where the hypotheses are written (one per line), or None.
        precision: the run's resolved precision: the search's autocast on an accelerator (the CPU
            decodes in fp32; :func:`~transformer.generation.common.decoding_precision`).
        dist_info: the run's :class:`~transformer.training.distributed.process_group.DistInfo`, or
            None for one process.

    Returns:
        :func:`~transformer.evaluation.metrics.corpus_scores` plus ``failed_lines``.
    """
    errors: dict[int, str] = {}
    ranks = dist_info.world_size if dist_info is not None else 1
    rank = dist_info.rank if dist_info is not None else 0
    hyps = translate_dataset(
        model,
        dataset,
        tgt_tokenizer,
        generation,
        device,
        errors=errors,
        progress=progress and rank == 0,
        desc=split,
        precision=precision,
        shard=(rank, ranks),
    )
    if ranks > 1:  # each rank's sentences (every line belongs to one rank's batches, or to none)
        mine = (hyps, errors)
        every: list[Any] = [None] * ranks
        torch.distributed.all_gather_object(every, mine)
        hyps = [next((h[i] for h, _ in every if h[i]), "") for i in range(len(hyps))]
        errors = {i: e for _, errs in every for i, e in errs.items()}
    if errors:
        first = min(errors)
        log(
            f"[{split}] {len(errors)} of {len(hyps)} sentences could not be translated (left empty), "
            f"e.g. line {first + 1}: {errors[first]}"
        )
    if hyp_file is not None and rank == 0:
        hyp_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(hyp_file, "".join(h + "\n" for h in hyps))
    scores = corpus_scores(hyps, dataset.tgt_text, tokenize=tokenize, lowercase=lowercase)
    return {**scores, "failed_lines": [i + 1 for i in sorted(errors)]}


class Validator:
    """A run's validation: the teacher-forced loss, BLEU/chrF with ``train.valid_bleu``, and the
    best result so far with the validations since it (``train.patience``).

    Args:
        cfg: the run's config (``train``, ``generation``, ``data``, ``model``).
        data: the corpus (``splits``, ``tgt_tokenizer``).
        criterion: the training loss.
        dist_info: rank, world size and device; every rank validates together.
        precision: the run's resolved precision (decoding's autocast on an accelerator).
        autocast: a context (the run's precision) around each forward of the loss.
        log: where lines go (rank 0's).

    Raises:
        TrainingError: no validation pair fits learned positions (:func:`scorable_pairs`).
    """

    def __init__(
        self,
        cfg: Config,
        data: Any,
        criterion: LabelSmoothedCrossEntropy,
        dist_info: DistInfo,
        precision: str,
        autocast: Callable[[], AbstractContextManager[Any]],
        log: Callable[[str], None],
    ) -> None:
        self.cfg, self.data, self.criterion, self.dist = cfg, data, criterion, dist_info
        self.precision, self.autocast, self.log = precision, autocast, log
        self.valid_set = scorable_pairs(data.splits["valid"], cfg.model)  # (pairs, a note to log once)
        self.best_metric: float | None = None
        self.bad_validations = 0  # validations in a row without improvement

    def loss(self, model: nn.Module, features: Callable[..., torch.Tensor] | None = None) -> dict[str, float]:
        """``{"loss", "nll_loss", "ppl"}`` per target token of ``model`` on the validation pairs it
        can score (:func:`teacher_forced_loss`); ``features``: its compiled hidden states, or None."""
        valid, note = self.valid_set
        if note:
            self.log(note)
            self.valid_set = (valid, None)
        return teacher_forced_loss(
            model,
            valid,
            self.criterion,
            arch=self.cfg.model.arch,
            max_tokens=self.cfg.train.max_tokens,
            device=self.dist.device,
            autocast=self.autocast,
            features=features,
        )

    def bleu(self, model: nn.Module, split: str, subset: int = 0, hyp_file: Path | None = None) -> dict[str, Any]:
        """Translate ``split`` (its first ``subset`` pairs when set) with ``cfg.generation`` and score
        it (:func:`translate_and_score`; every rank calls it under torchrun)."""
        dataset = self.data.splits[split]
        if subset and subset < len(dataset):
            dataset = dataset.subset(range(subset))
        return translate_and_score(
            model,
            dataset,
            self.data.tgt_tokenizer,
            self.cfg.generation,
            self.dist.device,
            split=split,
            tokenize=self.cfg.data.bleu_tokenize,
            lowercase=self.cfg.data.lowercase,
            progress=bool(self.cfg.train.progress),
            log=self.log,
            hyp_file=hyp_file,
            precision=self.precision,
            dist_info=self.dist,
        )

    def validate(
        self, model: nn.Module, update: int, logger: Any, features: Callable[..., torch.Tensor] | None = None
    ) -> bool:
        """One round on every rank: the loss on rank 0, broadcast so that every rank takes the same
        best and patience decisions, BLEU/chrF decoded by all ranks with ``train.valid_bleu``; the
        metrics logged (``logger.log(metrics, step, split="valid")``) with a line on rank 0.

        Returns:
            Whether this is the best result so far: BLEU (higher is better) with
            ``train.best_metric=bleu`` when computed, else the loss (lower is better).
        """
        t = self.cfg.train
        metrics: dict[str, Any] = self.loss(model, features) if self.dist.is_main else {}
        metrics = broadcast_from_main(metrics, self.dist)
        if t.valid_bleu:
            scores = self.bleu(model, "valid", subset=t.valid_bleu_subset)
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
        logger.log(metrics, step=update, split="valid")
        if self.dist.is_main:
            shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float))
            self.log(f"[valid] update {update}: {shown}")
        return is_best

    def state_dict(self) -> dict[str, Any]:
        """``{"best_metric", "bad_validations"}``, as a checkpoint holds them."""
        return {"best_metric": self.best_metric, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s entries (``state`` may hold a checkpoint's others too)."""
        self.best_metric, self.bad_validations = state["best_metric"], int(state["bad_validations"])
