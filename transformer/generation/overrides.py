"""Settings a script may change at test time: a RoPE scaling the model did not train with
(``model.position.rope_scaling.*`` of ``translate.yaml`` / ``evaluate.yaml``,
docs/decoding.md#rope-scaling-at-test-time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["TEST_TIME_FIELDS", "test_time_overrides", "test_time_refusal"]

TEST_TIME_FIELDS: tuple[str, ...] = ("model.position.rope_scaling",)
"""The model fields ``translate.py`` and ``evaluate.py`` may change at test time (a node covers the
fields below it): they change what a model computes without changing its weights."""


def test_time_overrides(script_cfg: Any) -> list[str]:
    """The dotlist of test-time overrides a script's config asks for: each non-null field of
    :data:`TEST_TIME_FIELDS`' nodes (and a plugin scaling's own field given with ``+``), e.g.
    ``["model.position.rope_scaling.rope_type=dynamic", "model.position.rope_scaling.factor=2.0"]``."""
    container = OmegaConf.to_container(script_cfg, resolve=True) if isinstance(script_cfg, DictConfig) else script_cfg
    out = []
    for dotted in TEST_TIME_FIELDS:
        node: Any = container
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        for key, value in (node or {}).items():
            if value is not None:
                out.append(f"{dotted}.{key}={value}")
    return out


def test_time_refusal(overrides: list[str], trained: Any, cfg: Any, run_dir: Path) -> str | None:
    """The sentence :func:`~transformer.generation.loading.load_run` raises when ``overrides`` cannot
    apply (a run trained without RoPE, or settings that change nothing), None when they can."""
    touched = [o for o in overrides if o.startswith("model.position.rope_scaling.")]
    if not touched:
        return None
    if cfg.model.position.name != "rope":
        return (
            f"{touched[0].split('=', 1)[0]} scales RoPE at test time, but {run_dir} was trained with "
            f"model/position={cfg.model.position.name}: a test-time RoPE scaling needs a run trained with "
            "model/position=rope"
        )
    was = str(getattr(trained, "rope_type", "default") or "default")
    now = cfg.model.position.rope_scaling
    if now.rope_type == "default" and was == "default":  # `default` reads none of the other fields
        return (
            f"{' '.join(touched)} changes nothing at test time: {run_dir} has "
            "model.position.rope_scaling.rope_type=default, which reads no other field; name a scaling "
            "(model.position.rope_scaling.rope_type=linear, ntk, dynamic, yarn or llama3)"
        )
    if trained is not None and all(getattr(trained, k, None) == getattr(now, k, None) for k in trained):
        return f"{' '.join(touched)} changes nothing at test time: {run_dir} was trained with that RoPE scaling"
    return None
