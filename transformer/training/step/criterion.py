"""Label-smoothed cross entropy (Szegedy et al. 2016 §7; Vaswani et al. 2017 §5.4), as
``F.cross_entropy(label_smoothing=eps)`` defines it, and the model's training loss.

Every loss is a sum over the non-ignored positions; the caller divides by ``ntokens``. The
definition against fairseq's, and why nothing here reads the device: docs/design.md#the-label-smoothed-loss."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.kernels.fused_loss import linear_label_smoothed_loss
from transformer.models import router_losses

# exp(100) ~ 2.7e43: far above any real perplexity, far below float overflow (exp(709)).
_MAX_PPL_EXPONENT = 100.0


def _on_host(t: Tensor) -> bool:
    """Whether reading ``t``'s values is free: an eager CPU tensor (no device sync, no graph break)."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def _count(keep: Tensor) -> Tensor | int:
    """True entries of ``keep``: a Python int on the host (:func:`_on_host`), else a device tensor."""
    return int(keep.sum()) if _on_host(keep) else keep.sum()


def _check_loss_args(target: Tensor, scores: Tensor, name: str, last_dim: str, epsilon: float) -> None:
    """Raise ValueError unless ``target.shape == scores.shape[:-1]`` and ``0 <= epsilon < 1``."""
    if tuple(target.shape) != tuple(scores.shape[:-1]):
        raise ValueError(
            f"target shape {tuple(target.shape)} must equal {name} shape without the {last_dim} "
            f"dimension, {tuple(scores.shape[:-1])}"
        )
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing epsilon={epsilon} must be in [0, 1)")


def label_smoothed_nll_loss(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int
) -> tuple[Tensor, Tensor, Tensor | int]:
    """Summed label-smoothed and plain negative log-likelihood, computed in fp32.

    Ignored positions add 0 to both sums and get zero gradient.

    Args:
        logits: ``(batch, seq_len, vocab)`` or ``(N, vocab)``, any float dtype.
        target: ``(batch, seq_len)`` or ``(N,)`` int64 class indices.
        epsilon: label smoothing in ``[0, 1)`` (0.1 in Vaswani et al. 2017).
        ignore_index: target value of positions to skip (the padding index).

    Returns:
        ``(loss_sum, nll_sum, ntokens)``: fp32 scalars in nats (the first differentiable), and the
        non-ignored count (a Python int for an eager CPU tensor, else an int64 device scalar).

    Raises:
        ValueError: ``target``'s shape is not ``logits``' without its last dimension, or ``epsilon``
            is outside ``[0, 1)``.
    """
    _check_loss_args(target, logits, "logits", "vocabulary", epsilon)
    vocab = logits.size(-1)
    lprobs = F.log_softmax(logits.reshape(-1, vocab), dim=-1, dtype=torch.float32)  # (N, V) fp32
    target = target.reshape(-1)  # (N,)
    keep = target != ignore_index  # (N,)
    safe_target = target.masked_fill(~keep, 0)  # gather needs a valid index at ignored positions
    nll = -lprobs.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)  # (N,)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    if epsilon > 0.0:
        smooth = -lprobs.mean(dim=-1)  # (N,): mean over the vocabulary of -log p
        smooth_sum = smooth.masked_fill(~keep, 0.0).sum()
        loss_sum = (1.0 - epsilon) * nll_sum + epsilon * smooth_sum
    else:
        loss_sum = nll_sum
    return loss_sum, nll_sum, _count(keep)


def linear_label_smoothed_nll_loss(
    hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, ignore_index: int, masked: bool | None = None
) -> tuple[Tensor, Tensor, Tensor | int]:
    """:func:`label_smoothed_nll_loss` of ``hidden @ weight.T``, fused with the output layer.

    The ``(N, V)`` logits are never stored (:func:`transformer.kernels.fused_loss.linear_label_smoothed_loss`).
    Only the smoothed loss is differentiable.

    Args:
        hidden: ``(batch, seq_len, d_model)`` or ``(N, d_model)``.
        weight: the output layer ``(vocab, d_model)`` (no bias).
        target: ``(batch, seq_len)`` or ``(N,)``.
        masked: True masks the ignored positions (fixed shapes), False drops them; None drops them in
            eager CPU mode only.

    Raises:
        ValueError: mismatched shapes or ``epsilon`` outside ``[0, 1)``.
    """
    _check_loss_args(target, hidden, "hidden", "model", epsilon)
    target = target.reshape(-1)  # (N,)
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (N, d)
    if masked is None:
        masked = not _on_host(hidden)
    if masked:
        keep = target != ignore_index  # (N,)
        loss, nll = linear_label_smoothed_loss(hidden.contiguous(), weight, target, epsilon, keep=keep)
        return loss, nll, _count(keep)
    rows = (target != ignore_index).nonzero().squeeze(1)  # (n,)
    h = hidden.index_select(0, rows)  # (n, d)
    loss, nll = linear_label_smoothed_loss(h.contiguous(), weight, target.index_select(0, rows), epsilon)
    return loss, nll, int(rows.numel())


class LabelSmoothedCrossEntropy:
    """Label-smoothed cross entropy as a callable criterion (:func:`label_smoothed_nll_loss`).

    Raises:
        ValueError: ``label_smoothing`` outside ``[0, 1)``.
    """

    def __init__(self, label_smoothing: float, ignore_index: int) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"criterion.label_smoothing={label_smoothing} must be in [0, 1)")
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = int(ignore_index)

    def __call__(self, logits: Tensor, target: Tensor) -> dict[str, Tensor | int]:
        """``{"loss", "nll_loss", "ntokens"}`` summed over the non-ignored positions of
        ``(batch, seq_len, vocab)`` logits; backpropagate ``loss / ntokens`` for the per-token mean."""
        loss, nll, ntokens = label_smoothed_nll_loss(logits, target, self.label_smoothing, self.ignore_index)
        return {"loss": loss, "nll_loss": nll, "ntokens": ntokens}

    def from_hidden(self, hidden: Tensor, output_proj: nn.Linear, target: Tensor) -> dict[str, Tensor | int]:
        """The same sums from ``(batch, seq_len, d_model)`` hidden states, fused with the output layer.

        Raises:
            ValueError: mismatched shapes, or an output layer with a bias.
        """
        if output_proj.bias is not None:
            raise ValueError("from_hidden needs an output layer without bias")
        loss, nll, ntokens = linear_label_smoothed_nll_loss(
            hidden, output_proj.weight, target, self.label_smoothing, self.ignore_index
        )
        return {"loss": loss, "nll_loss": nll, "ntokens": ntokens}

    def __repr__(self) -> str:
        return f"LabelSmoothedCrossEntropy(label_smoothing={self.label_smoothing}, ignore_index={self.ignore_index})"


def model_loss(
    model: nn.Module,
    criterion: LabelSmoothedCrossEntropy,
    net_input: dict[str, Tensor],
    target: Tensor,
    forward: Callable[..., Tensor] | None = None,
    features: Callable[..., Tensor] | None = None,
) -> dict[str, Tensor | int]:
    """The training loss of one batch, the way the trainer computes it.

    Without ``forward``, and when the output layer has no bias, ``features(**net_input)`` (default
    ``model.features``) feeds the fused :meth:`LabelSmoothedCrossEntropy.from_hidden`; otherwise
    ``forward(**net_input)`` gives the logits (the unfused reference path).

    A mixture-of-experts model in training mode also returns ``router_loss``, its weighted router
    losses times ``ntokens`` (differentiable, to add to ``loss`` before the backward pass), and for the
    logs ``moe_aux_loss``, ``moe_z_loss`` (detached), ``moe_load`` (``(n_moe_layers, n_experts)`` real
    tokens per expert) and ``moe_dropped``. Padding counts in none of them. ``loss`` stays the
    cross entropy, so validation reports it without the router terms."""
    proj = getattr(model, "output_proj", None)
    if forward is None and hasattr(model, "features") and proj is not None and proj.bias is None:
        out = criterion.from_hidden((features or model.features)(**net_input), proj, target)
    else:
        out = criterion((forward or model)(**net_input), target)
    routed = router_losses(model) if model.training else None
    if routed is not None:
        out.update(
            router_loss=routed.weighted * out["ntokens"],
            moe_aux_loss=routed.aux_loss.detach(),
            moe_z_loss=routed.z_loss.detach(),
            moe_load=routed.load,
            moe_dropped=routed.dropped,
        )
    return out


def perplexity(nll_per_token: float) -> float:
    """``exp(nll_per_token)`` in nats, capped at ``exp(100)``; NaN stays NaN. ``nll_per_token`` is
    the unsmoothed ``nll_sum / ntokens``."""
    x = float(nll_per_token)
    if math.isnan(x):
        return math.nan
    return math.exp(min(x, _MAX_PPL_EXPONENT))


__all__ = [
    "LabelSmoothedCrossEntropy",
    "label_smoothed_nll_loss",
    "linear_label_smoothed_nll_loss",
    "model_loss",
    "perplexity",
]
