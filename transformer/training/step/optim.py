"""Optimizers: Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019) with the betas and eps
of Vaswani et al. 2017 §5.3 by default. Which parameters AdamW decays, and the fused kernel:
docs/design.md#weight-decay-and-the-fused-optimizer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def _named_trainable(params: nn.Module | Iterable[Any]) -> tuple[list[tuple[str, nn.Parameter]], set[int]]:
    """Trainable ``(name, parameter)`` pairs and the ids of parameters owned by ``nn.Embedding``."""
    embedding_ids: set[int] = set()
    if isinstance(params, nn.Module):
        embedding_ids = {
            id(p) for m in params.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)
        }
        named = list(params.named_parameters())
    else:
        named = [it if isinstance(it, tuple) else (f"param_{i}", it) for i, it in enumerate(params)]
    named = [(n, p) for n, p in named if p.requires_grad]
    if not named:
        raise ValueError("there are no trainable parameters (requires_grad=True)")
    return named, embedding_ids


def param_groups_for_weight_decay(params: nn.Module | Iterable[Any], weight_decay: float) -> list[dict[str, Any]]:
    """The non-empty ones of a decayed group and a ``weight_decay=0`` group of the trainable parameters.

    Parameters with ``ndim < 2``, of ``nn.Embedding`` modules, or named ``*embed*`` are not decayed.
    ``params`` is a module, ``(name, parameter)`` pairs, or bare parameters (only the ``ndim`` rule).

    Raises:
        ValueError: no trainable parameters.
    """
    named, embedding_ids = _named_trainable(params)
    no_decay = [p for n, p in named if p.ndim < 2 or id(p) in embedding_ids or "embed" in n.lower()]
    no_decay_ids = {id(p) for p in no_decay}
    decay = [p for _, p in named if id(p) not in no_decay_ids]
    groups = [{"params": decay, "weight_decay": float(weight_decay)}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(params: nn.Module | Iterable[Any], cfg: Any, device_type: str) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` or ``AdamW`` from ``cfg``, fused or ``foreach`` by ``device_type`` when
    ``cfg.fused`` is None. ``params`` may also be a list of param-group dicts, used as given.

    Raises:
        ValueError: an unknown ``cfg.name``, a negative ``lr``/``weight_decay``, or no trainable parameters.
    """
    name = str(cfg.name).lower()
    if name not in ("adam", "adamw"):
        raise ValueError(f"optim.name={cfg.name!r} is not one of adam, adamw")
    if cfg.lr < 0 or cfg.weight_decay < 0:
        raise ValueError(f"optim.lr={cfg.lr} and optim.weight_decay={cfg.weight_decay} must be >= 0")
    if not isinstance(params, nn.Module):
        params = list(params)
    if isinstance(params, list) and params and isinstance(params[0], dict):
        groups = params
    elif name == "adamw":
        groups = param_groups_for_weight_decay(params, cfg.weight_decay)
    else:
        groups = [{"params": [p for _, p in _named_trainable(params)[0]]}]

    use_fused = device_type in ("cuda", "cpu") if cfg.fused is None else bool(cfg.fused)
    impl = {"fused": True} if use_fused else {"foreach": True}
    optimizer_cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return optimizer_cls(
        groups,
        lr=float(cfg.lr),
        betas=tuple(float(b) for b in cfg.betas),
        eps=float(cfg.eps),
        weight_decay=float(cfg.weight_decay),
        **impl,
    )


def total_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of the gradients of ``params`` together, on the device (no host read): what
    ``clip_grad_norm_`` measures without scaling (``train.clip_norm=0``). A DTensor under FSDP."""
    grads = [p.grad for p in params]
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        # one multi-tensor norm kernel per device and dtype off the CPU (which has no foreach kernels)
        foreach = True if grads and grads[0].device.type != "cpu" else None
        return torch.nn.utils.get_total_norm(grads, foreach=foreach)
    return torch.nn.utils.clip_grad_norm_(params, float("inf"))  # torch 2.5: the same norm, one more pass


__all__ = ["build_optimizer", "param_groups_for_weight_decay", "total_norm"]
