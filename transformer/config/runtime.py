"""What the ``train`` fields mean while a run runs: the time budget that stops it
(:func:`time_budget`, :func:`budget_sentence`), the values of ``train.resume``
(:func:`resume_mode`) and where Hydra records a job (:func:`hydra_subdir`, the ``zoo.hydra_subdir``
resolver of ``configs/train.yaml``, registered when this module is imported)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from transformer.hydra_record import record_subdir
from transformer.run_folder import has_checkpoint

__all__ = ["DEFAULT_TIME_BUDGET_S", "RESUME_MODES", "budget_sentence", "resume_mode", "time_budget"]


DEFAULT_TIME_BUDGET_S = 1380.0
"""The default run's budget: 23 minutes of training (``train.max_time`` null and no other budget)."""


def time_budget(train: Any) -> float:
    """The training-time limit in seconds that ``train`` (a
    :class:`~transformer.config.schema.TrainConfig` or its DictConfig) stops at: ``train.max_time``
    when set (0 = none); when null, :data:`DEFAULT_TIME_BUDGET_S` if neither ``train.max_updates``
    nor ``train.max_epochs`` is set, else 0 (an explicit update or epoch budget is not cut by the
    default time limit, on a first start as on a resume)."""
    if train.max_time is not None:
        return float(train.max_time)
    return DEFAULT_TIME_BUDGET_S if train.max_updates <= 0 and train.max_epochs <= 0 else 0.0


def budget_sentence(train: Any) -> str:
    """What stops a run, in words (logged at the start): ``"train.max_updates=4000"``,
    ``"1380 s of training (the default time budget; train.max_updates=N replaces it)"``, ..."""
    parts = []
    if train.max_updates > 0:
        parts.append(f"train.max_updates={train.max_updates}")
    if train.max_epochs > 0:
        parts.append(f"train.max_epochs={train.max_epochs}")
    seconds = time_budget(train)
    if seconds > 0:
        parts.append(
            f"train.max_time={seconds:g}s"
            if train.max_time is not None
            else f"{seconds:g} s of training (the default time budget; train.max_updates=N replaces it)"
        )
    if train.patience > 0:
        parts.append(f"train.patience={train.patience} validations without improvement")
    return ", or ".join(parts) + (" (whichever comes first)" if len(parts) > 1 else "")


RESUME_MODES = (False, True, "auto")
"""The values of ``train.resume``."""


def resume_mode(value: Any) -> bool | str:
    """``train.resume`` as one of :data:`RESUME_MODES` (Hydra gives ``true``/``false`` as bools, and
    a str-typed override as ``"true"``/``"false"``).

    Raises:
        ValueError: any other value (the message names the field and the allowed values).
    """
    text = str(value).strip().lower()
    if text in ("true", "false", "auto"):
        return {"true": True, "false": False}.get(text, "auto")
    raise ValueError(f"train.resume={value!r} is not one of false, true, auto")


def hydra_subdir(resume: Any = False, resume_from: Any = None, output_dir: Any = None) -> str | None:
    """Where Hydra records a training job in its run folder (``hydra.output_subdir`` of
    ``configs/train.yaml``, as the resolver
    ``${zoo.hydra_subdir:${train.resume},${train.resume_from},${hydra:runtime.output_dir}}``).

    Args:
        resume: ``train.resume``.
        resume_from: ``train.resume_from``.
        output_dir: the job's run folder, when known: with ``train.resume=true|auto`` the job is a
            resume only when the folder holds a ``checkpoint_last`` (else it is the run's first start).

    Returns:
        :func:`transformer.hydra_record.record_subdir`'s name: ``.hydra`` for a new run,
        ``.hydra/resume-<date>_<time>`` for a resumed one, None when another process holds the folder.
    """
    if str(resume_from or "").lower() not in ("", "none", "null"):
        resuming = True
    else:
        try:
            mode = resume_mode(resume)
        except ValueError:
            mode = False  # validate_config reports it, with the other fields
        resuming = bool(mode)
        if resuming and str(output_dir or "").lower() not in ("", "none", "null"):
            # the run folder's checkpoint_last (transformer/run_folder.py: the layout's one home)
            resuming = has_checkpoint(str(output_dir))
    return record_subdir(resuming, output_dir)


if not OmegaConf.has_resolver("zoo.hydra_subdir"):  # at import: jobs unpickled on a cluster node have it too
    OmegaConf.register_new_resolver("zoo.hydra_subdir", hydra_subdir, use_cache=True)
