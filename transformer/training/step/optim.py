"""Optimizers: Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019) with the betas and
eps of Vaswani et al. 2017 §5.3 by default (``OptimConfig``).

Weight decay:

- ``adam``: ``torch.optim.Adam(weight_decay=...)``, i.e. L2 regularisation added to the gradient,
  applied to every parameter. (fairseq's ``adam`` decays decoupled, like AdamW, on all
  parameters; use ``adamw`` for decoupled decay.)
- ``adamw``: decoupled decay on the weight matrices only. Biases, norm gains (every parameter
  with fewer than 2 dimensions) and embeddings (parameters of ``nn.Embedding`` modules, or whose
  name contains ``embed``) go to a second param group with ``weight_decay=0`` (the GPT-2/minGPT
  and Hugging Face convention). A weight tied between an embedding and the output projection is
  one parameter, owned by the embedding, so it is not decayed.

Implementation: when ``cfg.fused`` is None, the fused single-kernel update on CUDA and CPU (on
CPU PyTorch runs ``foreach`` as a loop over parameters, which is slower: measured in
``docs/benchmarks/cpu_choices.md``) and ``foreach`` elsewhere; ``cfg.fused=True`` forces the fused
kernels, ``False`` forces ``foreach``.
"""

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
    """Split trainable parameters into a decayed and a non-decayed group.

    Parameters with ``ndim < 2`` (biases, norm gains), parameters of ``nn.Embedding`` modules and
    parameters whose name contains ``embed`` are not decayed.

    Args:
        params: a module (names and ``nn.Embedding`` ownership are used), an iterable of
            ``(name, parameter)`` pairs, or an iterable of parameters (only the ``ndim < 2`` rule
            applies). Parameters with ``requires_grad=False`` are left out.
        weight_decay: the decay of the first group.

    Returns:
        The non-empty ones of ``[{"params": [...], "weight_decay": weight_decay},
        {"params": [...], "weight_decay": 0.0}]``.

    Raises:
        ValueError: when there are no trainable parameters.
    """
    named, embedding_ids = _named_trainable(params)
    no_decay = [p for n, p in named if p.ndim < 2 or id(p) in embedding_ids or "embed" in n.lower()]
    no_decay_ids = {id(p) for p in no_decay}
    decay = [p for _, p in named if id(p) not in no_decay_ids]
    groups = [{"params": decay, "weight_decay": float(weight_decay)}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(params: nn.Module | Iterable[Any], cfg: Any, device_type: str) -> torch.optim.Optimizer:
    """Build Adam or AdamW from ``cfg`` (see the module docstring for weight-decay groups).

    Args:
        params: a module, an iterable of ``(name, parameter)`` pairs, an iterable of parameters,
            or a list of param-group dicts (used as given).
        cfg: a :class:`transformer.config.OptimConfig` (``name``, ``lr``, ``betas``, ``eps``,
            ``weight_decay``, ``fused``).
        device_type: where the parameters live (``"cuda"``, ``"cpu"``, ``"mps"``); picks
            ``fused``/``foreach`` when ``cfg.fused`` is None.

    Returns:
        A ``torch.optim.Adam`` or ``torch.optim.AdamW`` with ``lr=cfg.lr`` (the scheduler
        overwrites it before the first update).

    Raises:
        ValueError: for an unknown ``cfg.name``, a negative ``lr``/``weight_decay``, or no
            trainable parameters.
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
    """The 2-norm of the gradients of ``params`` taken together, on the device (no host read): what
    ``clip_grad_norm_`` measures, without its pass scaling every gradient (``train.clip_norm=0``).

    Args:
        params: parameters whose ``grad`` is set (DTensors under FSDP give a DTensor of partial norms).

    Returns:
        A scalar tensor (fp32 for fp32 gradients).
    """
    grads = [p.grad for p in params]
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        # one multi-tensor norm kernel per device and dtype off the CPU (which has no foreach kernels)
        foreach = True if grads and grads[0].device.type != "cpu" else None
        return torch.nn.utils.get_total_norm(grads, foreach=foreach)
    return torch.nn.utils.clip_grad_norm_(params, float("inf"))  # torch 2.5: the same norm, one more pass


__all__ = ["build_optimizer", "param_groups_for_weight_decay", "total_norm"]
