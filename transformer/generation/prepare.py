"""What ``scripts/translate.py`` and ``scripts/evaluate.py`` do before they decode: threads, device,
test-time overrides, the run or ensemble loaded, its generation settings with the script's on top,
and the decoding precision. The scripts' ``main`` is :func:`transformer.cli.run_script`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer.config import ConfigError, GenerationConfig
from transformer.device import resolve_device, unavailable
from transformer.generation.ensemble import load_models
from transformer.generation.loading import LoadedRun, merge_generation
from transformer.generation.overrides import test_time_overrides
from transformer.precision import decoding_precision

__all__ = ["PreparedDecoding", "prepare_decoding"]


@dataclass
class PreparedDecoding:
    """A loaded run (or ensemble) ready to decode with a script's settings.

    Attributes:
        test_time: the test-time overrides applied (a dotlist, e.g. a RoPE scaling).
        gen: the run's generation settings with the script's non-null ``generation.*`` on top.
        members: an ensemble's checkpoints, else None.
        precision: the search's precision on ``device`` (:func:`~transformer.precision.decoding_precision`).
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
    """Set up decoding from ``configs/translate.yaml`` or ``configs/evaluate.yaml`` as composed.

    Raises:
        ConfigError: ``device=cuda`` without a GPU, invalid generation settings or an unknown ``precision``.
        LoadError: a checkpoint that does not load.
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
