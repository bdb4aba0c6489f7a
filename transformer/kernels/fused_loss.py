"""The output layer fused with the label-smoothed cross entropy (Liger-Kernel's fused linear cross
entropy, Hsu et al. 2024): ``sum_i loss_i(hidden_i @ weight.T)`` without the ``(N, V)`` logits.

The textbook formula, per row ``i`` with logits ``z_i = hidden_i @ weight.T`` and ``log p_i =
log_softmax(z_i)``, is ``(1 - eps) * (-log p_i[y_i]) + eps * mean_c(-log p_i[c])`` (the definition of
:mod:`transformer.training.step.criterion`, where the arguments are checked). Ignored positions are either
dropped by the caller (eager CPU) or masked here (``keep``: every shape fixed, no host sync).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _chunk_rows(vocab: int) -> int:
    """Rows per chunk of the fused output layer: ~4M logits (16 MiB in fp32) at a time."""
    return max(16, (1 << 22) // max(vocab, 1))


class _LinearLabelSmoothedLoss(torch.autograd.Function):
    """``sum_i loss_i(hidden_i @ weight.T)`` without materialising the ``(N, V)`` logits.

    The forward pass walks over row chunks: logits of a chunk (in cache), its log-sum-exp, the
    smoothed loss and NLL, then the gradient ``softmax - target_distribution`` of the chunk, which
    is multiplied straight away into the gradients of ``hidden`` and ``weight`` (Liger-Kernel's
    fused linear cross entropy, Hsu et al. 2024). The backward pass only scales them by the
    incoming gradient. The same three matmuls as ``F.linear`` + loss, but no ``(N, V)`` tensor
    (and its log-softmax, gather and mean backward passes) ever goes through memory.

    With a row mask ``keep``, the rows where it is False take part in the matmuls but add nothing to
    the sums and get zero gradient (their hidden rows are zeroed for the weight gradient, their
    gradient rows zeroed at the end): the same sums as dropping those rows beforehand, on fixed shapes.
    """

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, keep: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        n, vocab = hidden.shape[0], weight.shape[0]
        device = hidden.device.type
        # under autocast the matmuls run in the autocast dtype, the softmax always in fp32
        cdt = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_grad else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grad else None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        # under torch.compile one chunk of all rows: a loop over a dynamic row count would guard on
        # its value (a recompilation per batch shape); the (N, V) logits are then materialised
        step = _chunk_rows(vocab)
        starts = (0,) if torch.compiler.is_compiling() else range(0, n, step)
        step = n if torch.compiler.is_compiling() else step
        with torch.autocast(device, enabled=False):
            if keep is not None:  # masked rows: a valid class index, zero hidden rows for the weight gradient
                target = target.masked_fill(~keep, 0)
                hidden = hidden.masked_fill(~keep[:, None], 0.0)
            hidden_c, weight_c = hidden.to(cdt), weight.to(cdt)
            for lo in starts:
                h = hidden_c[lo : lo + step]  # (C, d)
                y = target[lo : lo + step, None]  # (C, 1)
                lprobs = torch.log_softmax(torch.mm(h, weight_c.t()).float(), 1)  # (C, V) fp32
                picked, spread = lprobs.gather(1, y).squeeze(1), lprobs.mean(1)  # (C,), (C,)
                if keep is not None:
                    k = keep[lo : lo + step]
                    picked, spread = picked.masked_fill(~k, 0.0), spread.masked_fill(~k, 0.0)
                nll = -picked.sum()
                nll_sum += nll
                loss += (1.0 - epsilon) * nll - epsilon * spread.sum()
                if not need_grad:
                    continue
                # d loss_i / d z = softmax - (1 - eps) * onehot(y) - eps / V: the softmax part goes
                # through the matmuls, the two constant parts are added on (C, d) / (V, d) below
                g = lprobs.exp_().to(cdt)  # (C, V)
                rows = grad_h[lo : lo + step]
                if grad_h.dtype == cdt:
                    torch.mm(g, weight_c, out=rows)
                else:
                    rows.copy_(torch.mm(g, weight_c))
                rows.sub_(weight[y[:, 0]].to(rows.dtype), alpha=1.0 - epsilon)  # onehot part
                if cdt == torch.float32:
                    grad_w.addmm_(g.t(), h)
                else:
                    grad_w += torch.mm(g.t(), h).float()
            if need_grad:
                grad_w.index_add_(0, target, hidden.float(), alpha=-(1.0 - epsilon))  # onehot part
                if epsilon > 0.0:  # uniform part: -eps / V for every class
                    grad_h.sub_(weight.float().sum(0).to(grad_h.dtype), alpha=epsilon / vocab)
                    grad_w.sub_(hidden.float().sum(0), alpha=epsilon / vocab)
                if keep is not None:
                    grad_h.masked_fill_(~keep[:, None], 0.0)
        ctx.mark_non_differentiable(nll_sum)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_loss.to(grad_h.dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_w * grad_loss).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None


def linear_label_smoothed_loss(
    hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, keep: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and NLL of ``logits = hidden @ weight.T``, never storing the logits.

    Args:
        hidden: ``(N, d_model)`` the rows (contiguous).
        weight: the output layer ``(vocab, d_model)``.
        target: ``(N,)`` class indices; any value where ``keep`` is False.
        epsilon: label smoothing in ``[0, 1)``.
        keep: optional ``(N,)`` bool, True at the rows that take a loss; the others add nothing and
            get zero gradient (None: every row counts).

    Returns:
        ``(loss_sum, nll_sum)``, fp32 scalars in nats; the gradient reaches ``hidden`` and
        ``weight`` through ``loss_sum`` only (``nll_sum`` is not differentiable).
    """
    return _LinearLabelSmoothedLoss.apply(hidden, weight, target, float(epsilon), keep)


__all__ = ["linear_label_smoothed_loss"]
