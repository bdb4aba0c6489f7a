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
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# exp(100) ~ 2.7e43: far above any real perplexity, far below float overflow (exp(709)).
_MAX_PPL_EXPONENT = 100.0


def label_smoothed_nll_loss(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int
) -> tuple[Tensor, Tensor, int]:
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
        Python int; reading it synchronises with the device).

    Raises:
        ValueError: when ``target``'s shape is not ``logits``' without the vocabulary dimension,
            or ``epsilon`` is outside ``[0, 1)``.
    """
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"target shape {tuple(target.shape)} must equal logits shape without the vocabulary "
            f"dimension, {tuple(logits.shape[:-1])}"
        )
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing epsilon={epsilon} must be in [0, 1)")
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
    return loss_sum, nll_sum, int(keep.sum().item())


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
            "nll_loss": fp32 scalar sum without smoothing, "ntokens": int}``.

        Raises:
            ValueError: on mismatched shapes.
        """
        loss, nll, ntokens = label_smoothed_nll_loss(logits, target, self.label_smoothing, self.ignore_index)
        return {"loss": loss, "nll_loss": nll, "ntokens": ntokens}

    def __repr__(self) -> str:
        return f"LabelSmoothedCrossEntropy(label_smoothing={self.label_smoothing}, ignore_index={self.ignore_index})"


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


__all__ = ["LabelSmoothedCrossEntropy", "label_smoothed_nll_loss", "perplexity"]
