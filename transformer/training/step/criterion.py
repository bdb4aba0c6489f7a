"""Label-smoothed cross entropy (Szegedy et al. 2016 §7; Vaswani et al. 2017 §5.4).

Definition used here (the same as ``torch.nn.functional.cross_entropy(label_smoothing=eps)``):
the target distribution puts ``1 - eps`` on the true class and spreads ``eps`` uniformly over
**all** ``V`` classes (the true class included), so per token

    loss = (1 - eps) * (-log p[y]) + eps * mean_{c=1..V}(-log p[c]).

fairseq's ``label_smoothed_nll_loss`` differs slightly: it spreads ``eps`` over the ``V - 1``
*other* classes (``eps_i = eps / (V - 1)``, loss ``(1 - eps - eps_i) * nll + eps_i * sum_c -log
p[c]``), so the true class gets exactly ``1 - eps`` there and ``1 - eps + eps / V`` here. For a
vocabulary of thousands of types the two differ by ``O(eps / V)``, and ours equals fairseq's with
``eps * (V - 1) / V``. We follow PyTorch so that the loss can be checked against
``F.cross_entropy``.

Everything is a **sum** over the non-ignored target positions; normalising (per target token, as
fairseq does for its reported loss and gradient, or per sentence) is the caller's job: divide by
``ntokens`` (summed over gradient-accumulation steps and workers).

No function here reads a device value on the host: on an accelerator (or under ``torch.compile``)
``ntokens`` stays an int64 scalar tensor on the device and the fused output layer masks the ignored
positions instead of dropping them (fixed shapes, no ``nonzero``); in eager CPU mode, where reading
a value costs no synchronisation, ``ntokens`` is a Python int and the fused layer drops the ignored
rows (less work: a decoder-only model's source positions take no loss).

A model with mixture-of-experts blocks adds its router losses in :func:`model_loss` (training mode
only), scaled by the batch's target tokens like the summed loss, so that after the division by
``ntokens`` they enter the update as ``coef * loss`` per micro-batch (Hugging Face's
``loss + router_aux_loss_coef * aux_loss``).
"""

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

    ``log_softmax`` runs once, in fp32 whatever the dtype of ``logits``; the fp32
    log-probabilities are the only ``(N, V)`` tensor this function keeps (PyTorch may cast
    low-precision logits to fp32 inside ``log_softmax``; it does not for fp16 on CUDA).
    Ignored positions contribute 0 to both sums and their logits get zero gradient.

    Args:
        logits: unnormalised scores, ``(batch, seq_len, vocab)`` or ``(N, vocab)``, any float dtype.
        target: class indices, ``(batch, seq_len)`` or ``(N,)`` (int64), matching ``logits``
            without its last dimension.
        epsilon: label smoothing in ``[0, 1)`` (0.1 in Vaswani et al. 2017).
        ignore_index: target value of positions to skip (the padding index); may be negative.

    Returns:
        ``(loss_sum, nll_sum, ntokens)``: the smoothed loss summed over non-ignored positions
        (fp32 scalar tensor, in nats, differentiable), the unsmoothed negative log-likelihood
        summed likewise (fp32 scalar tensor, nats), and the number of non-ignored positions (a
        Python int for an eager CPU tensor, else an int64 scalar tensor on the device: no host sync).

    Raises:
        ValueError: when ``target``'s shape is not ``logits``' without the vocabulary dimension,
            or ``epsilon`` is outside ``[0, 1)``.
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
    """:func:`label_smoothed_nll_loss` of ``logits = hidden @ weight.T``, fused with the output layer.

    The ``(N, V)`` logits are never stored: see
    :func:`transformer.kernels.fused_loss.linear_label_smoothed_loss`. In eager CPU mode only the
    non-ignored positions go through the output layer (no logits for padding or, in a decoder-only
    prefix LM, for the source: ``nonzero`` then costs nothing); on an accelerator and under
    ``torch.compile`` every position does, the ignored ones masked (fixed shapes, no host sync; the
    same sums up to the order of summation, zero gradient at the ignored positions). The values
    equal ``label_smoothed_nll_loss(hidden @ weight.T, ...)`` up to float rounding; the gradient
    reaches ``hidden`` and ``weight`` through the smoothed loss only (the returned NLL is for reporting and is not differentiable).

    Args:
        hidden: final hidden states ``(batch, seq_len, d_model)`` or ``(N, d_model)``.
        weight: the output layer ``(vocab, d_model)`` (no bias).
        target: ``(batch, seq_len)`` or ``(N,)`` class indices.
        epsilon: label smoothing in ``[0, 1)``.
        ignore_index: target value of positions to skip.
        masked: True to mask the ignored positions, False to drop them; None (default): drop them
            in eager CPU mode only.

    Returns:
        ``(loss_sum, nll_sum, ntokens)`` as :func:`label_smoothed_nll_loss`.

    Raises:
        ValueError: on mismatched shapes or ``epsilon`` outside ``[0, 1)``.
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
    """Label-smoothed cross entropy as a callable criterion; see :func:`label_smoothed_nll_loss`.

    Args:
        label_smoothing: ``epsilon`` in ``[0, 1)`` (``criterion.label_smoothing``).
        ignore_index: the padding index of the target vocabulary.

    Raises:
        ValueError: when ``label_smoothing`` is outside ``[0, 1)``.
    """

    def __init__(self, label_smoothing: float, ignore_index: int) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"criterion.label_smoothing={label_smoothing} must be in [0, 1)")
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = int(ignore_index)

    def __call__(self, logits: Tensor, target: Tensor) -> dict[str, Tensor | int]:
        """Sums over the non-ignored positions of one batch.

        Args:
            logits: ``(batch, seq_len, vocab)`` or ``(N, vocab)``.
            target: ``(batch, seq_len)`` or ``(N,)``.

        Returns:
            ``{"loss": fp32 scalar sum (backpropagate loss / ntokens for the per-token mean),
            "nll_loss": fp32 scalar sum without smoothing, "ntokens": int, or an int64 scalar tensor
            off the eager CPU path}``.

        Raises:
            ValueError: on mismatched shapes.
        """
        loss, nll, ntokens = label_smoothed_nll_loss(logits, target, self.label_smoothing, self.ignore_index)
        return {"loss": loss, "nll_loss": nll, "ntokens": ntokens}

    def from_hidden(self, hidden: Tensor, output_proj: nn.Linear, target: Tensor) -> dict[str, Tensor | int]:
        """The same sums from the final hidden states, fused with the (bias-free) output layer.

        See :func:`linear_label_smoothed_nll_loss`: no ``(N, V)`` tensor in memory, ignored
        positions dropped (eager CPU) or masked; ``nll_loss`` is not differentiable.

        Args:
            hidden: ``(batch, seq_len, d_model)`` (the model's ``features``).
            output_proj: the model's ``Linear(d_model, vocab, bias=False)``.
            target: ``(batch, seq_len)``.

        Returns:
            ``{"loss", "nll_loss", "ntokens"}`` as :meth:`__call__`.

        Raises:
            ValueError: on mismatched shapes, or an output layer with a bias.
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

    Without ``forward``, and when the output layer has no bias, ``features(**net_input)``
    (default ``model.features``; e.g. a ``torch.compile`` d ``model.features``) gives the final
    hidden states and :meth:`LabelSmoothedCrossEntropy.from_hidden` applies the output layer fused
    with the loss, at the target positions only. Otherwise ``forward(**net_input)`` returns the
    logits for :meth:`LabelSmoothedCrossEntropy.__call__` (the unfused reference path).

    A model in training mode with mixture-of-experts blocks also returns its router losses
    (:func:`~transformer.models.router_losses` of this forward pass, once per call): ``router_loss``
    = ``(router_aux_loss_coef * aux + router_z_loss_coef * z) * ntokens``, differentiable, to add
    to ``loss`` before the backward pass (the trainer does), so that divided by the update's target
    tokens like ``loss`` it weighs each micro-batch by its tokens; ``moe_aux_loss`` and
    ``moe_z_loss`` (unweighted, detached), ``moe_load`` (``(n_moe_layers, n_experts)`` assignments
    of real tokens per expert) and ``moe_dropped`` (0) for the logs. The padding of ``net_input``
    counts in none of them (the models pass it to their MoE layers as a token mask). ``loss`` itself stays the label-smoothed
    cross entropy, so validation (eval mode) reports it without the router terms.

    Args:
        model: an encoder-decoder or decoder-only model (``features`` and ``output_proj``).
        criterion: the loss.
        net_input: the batch's model inputs.
        target: ``(batch, seq_len)`` targets.
        forward: optional logits function used instead of the fused path.
        features: optional hidden-state function used instead of ``model.features``.

    Returns:
        ``{"loss", "nll_loss", "ntokens"}`` sums as :meth:`LabelSmoothedCrossEntropy.__call__`,
        plus the router entries above for a mixture of experts in training mode.
    """
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
    """Perplexity ``exp(nll_per_token)`` (base e, matching nats), capped at ``exp(100)``.

    Args:
        nll_per_token: mean negative log-likelihood per target token, in nats (``nll_sum /
            ntokens``, without label smoothing).

    Returns:
        ``exp(min(nll_per_token, 100))``; NaN stays NaN.
    """
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
