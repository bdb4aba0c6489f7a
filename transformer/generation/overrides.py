"""Settings a script may change at test time: a trained model decoded with a RoPE scaling it did
not train with (``model.position.rope_scaling.*`` of ``translate.yaml`` / ``evaluate.yaml``).

:func:`test_time_overrides` turns the fields a user set into overrides of the run's config, which
:func:`~transformer.generation.loading.load_run` applies after checking the weights against the run's
own config; :func:`test_time_refusal` says why they cannot apply (a run without RoPE, or settings that
change nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["TEST_TIME_FIELDS", "test_time_overrides", "test_time_refusal"]

TEST_TIME_FIELDS: tuple[str, ...] = ("model.position.rope_scaling",)
"""The model fields ``translate.py`` and ``evaluate.py`` may change at test time (a node covers the
fields below it): they change what a model computes without changing its weights."""


def test_time_overrides(script_cfg: Any) -> list[str]:
    """The test-time model overrides a script's config asks for, as a dotlist for
    :func:`~transformer.generation.loading.load_run`.

    ``translate.yaml`` and ``evaluate.yaml`` hold the nodes of :data:`TEST_TIME_FIELDS` (e.g.
    ``model.position.rope_scaling``, :class:`~transformer.config.RopeScalingOverrides`) with every
    field null; a field set on the command line becomes ``"<dotted field>=<value>"``. A plugin RoPE
    scaling's own field, which that node lacks, is appended with Hydra's ``+``
    (``+model.position.rope_scaling.stretch=4``) and becomes an override the same way.

    Args:
        script_cfg: the script's composed config (a DictConfig or dict); one without a ``model``
            node asks for nothing.

    Returns:
        e.g. ``["model.position.rope_scaling.rope_type=dynamic", "model.position.rope_scaling.factor=2.0"]``.
    """
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
    """Why test-time overrides cannot apply to a run, None when they can: a test-time RoPE scaling
    needs a run trained with RoPE, and must change what the model computes.

    Args:
        overrides: the dotlist applied to the run's config.
        trained: ``model.position.rope_scaling`` as the run trained (a DictConfig node, or None).
        cfg: the run's config with the overrides applied.
        run_dir: the run folder (for the messages).

    Returns:
        The sentence :func:`~transformer.generation.loading.load_run` raises as a ``LoadError``, or None.
    """
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
