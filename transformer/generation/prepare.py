"""What ``scripts/translate.py`` and ``scripts/evaluate.py`` do before they decode, in one place:
the thread count, the device (refused when torch cannot use it), the test-time overrides, the run or
ensemble loaded with them, its generation settings with the script's on top, and the precision it
decodes in.

:func:`prepare_decoding` is called by :func:`transformer.generation.translate_file.translate_file`
and :func:`transformer.evaluation.command.evaluate_checkpoint`; :func:`run_script` is the body of
both scripts' ``main``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer.cli import user_errors
from transformer.config import ConfigError, GenerationConfig
from transformer.device import resolve_device, unavailable
from transformer.generation.common import decoding_precision
from transformer.generation.ensemble import load_models
from transformer.generation.loading import LoadedRun, merge_generation
from transformer.generation.overrides import test_time_overrides
from transformer.plugins import set_user_choice

__all__ = ["PreparedDecoding", "prepare_decoding", "run_script"]


@dataclass
class PreparedDecoding:
    """A loaded run (or ensemble) ready to decode with a script's settings.

    Attributes:
        device: where the model is.
        test_time: the test-time overrides applied to the run's config (e.g. a RoPE scaling), a dotlist.
        loaded: the run or ensemble (:class:`~transformer.generation.loading.LoadedRun`).
        gen: the run's generation settings with the script's non-null ``generation.*`` on top.
        members: an ensemble's checkpoints, else None.
        precision: what the search runs in on ``device``: ``fp32`` on the CPU, else the script's
            ``precision`` or the run's ``train.precision`` (an ensemble: the first member's), as
            :func:`~transformer.generation.common.decoding_precision` resolves it.
    """

    device: torch.device
    test_time: list[str]
    loaded: LoadedRun
    gen: GenerationConfig
    members: list[Path] | None
    precision: str = "fp32"

    @property
    def source(self) -> str:
        """What decodes, for a report line: ``ensemble of a, b`` or the checkpoint file."""
        if self.members:
            return f"ensemble of {', '.join(map(str, self.members))}"
        return str(self.loaded.checkpoint)


def prepare_decoding(cfg: Any) -> PreparedDecoding:
    """Set up decoding from a script's config (``configs/translate.yaml`` or ``configs/evaluate.yaml``).

    Args:
        cfg: the composed config: ``num_threads`` (> 0 sets torch's), ``device``, ``checkpoint``
            (a run folder or checkpoint, or a list: an ensemble), ``src_tokenizer``/``tgt_tokenizer``,
            ``generation.*`` (null keeps the run's) and ``model.position.rope_scaling.*`` (a test-time
            RoPE scaling, :func:`~transformer.generation.overrides.test_time_overrides`) and
            ``precision`` (null: the run's ``train.precision``; the CPU decodes in fp32 whatever it says).

    Returns:
        The :class:`PreparedDecoding`.

    Raises:
        ConfigError: ``device=cuda`` where torch sees no GPU, invalid generation settings or an
            unknown ``precision``.
        LoadError: a checkpoint that does not load (see :func:`~transformer.generation.load_models`).
    """
    if cfg.num_threads > 0:
        torch.set_num_threads(int(cfg.num_threads))
    device = resolve_device(cfg.device)
    if why := unavailable(device, "device"):
        raise ConfigError(why)
    test_time = test_time_overrides(cfg)  # e.g. a RoPE scaling the run did not train with
    loaded = load_models(
        cfg.checkpoint, device, src_tokenizer=cfg.src_tokenizer, tgt_tokenizer=cfg.tgt_tokenizer, overrides=test_time
    )
    gen = merge_generation(loaded.cfg.generation, cfg.generation)
    members = getattr(loaded.model, "checkpoints", None)
    try:
        precision = decoding_precision(str(cfg.get("precision") or loaded.cfg.train.precision), device)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return PreparedDecoding(
        device=device,
        test_time=test_time,
        loaded=loaded,
        gen=gen,
        members=list(members) if members else None,
        precision=precision,
    )


def run_script(cfg: Any, work: Callable[[Any], Any], errors: dict, **options: Any) -> Any:
    """A script's ``main`` for a run it loads: the run's plugins found (where they are, or trust in
    the run's copy: :func:`~transformer.plugins.set_user_choice`), then ``work(cfg)``; a user error
    or a plugin's code raising is one line on stderr and an exit status.

    Args:
        cfg: the script's composed config (``plugins``, ``plugins_trust`` and what ``work`` reads).
        work: the script's work (``translate_file``, ``evaluate``).
        errors: exception type (or tuple of types) -> exit status, as :func:`~transformer.cli.user_errors` takes.
        **options: more of :func:`~transformer.cli.user_errors`' keywords (``broken_pipe=0``);
            ``plugins`` is 2.

    Returns:
        What ``work`` returns.

    Raises:
        SystemExit: a user error (:func:`~transformer.cli.user_errors`).
    """
    with user_errors(errors, plugins=2, **options):
        set_user_choice(cfg.plugins, cfg.plugins_trust)
        return work(cfg)
