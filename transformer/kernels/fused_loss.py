"""The output layer fused with the label-smoothed cross entropy (Liger-Kernel's fused linear cross
entropy, Hsu et al. 2024): ``sum_i loss_i(hidden_i @ weight.T)`` without the ``(N, V)`` logits.

The textbook formula, per row ``i`` with logits ``z_i = hidden_i @ weight.T`` and ``log p_i =
log_softmax(z_i)``, is ``(1 - eps) * (-log p_i[y_i]) + eps * mean_c(-log p_i[c])`` (the definition of
:mod:`transformer.training.step.criterion`, where the arguments are checked). Ignored positions are either
dropped by the caller (eager CPU) or masked here (``keep``: every shape fixed, no host sync).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# Logits per chunk on the CPU: ~4M (16 MiB in fp32), a chunk's logits and log-probabilities staying
# in the cache between the matmul that writes them and the matmuls that read them back.
_CPU_CHUNK_LOGITS = 1 << 22
# Chunks of a call under torch.compile: every chunk is traced into the graph, so their number is
# capped (the graph's size and compile time grow with it); 32 keeps a chunk's fp32 logits at
# 1/32 of the (N, V) tensor.
_MAX_COMPILED_CHUNKS = 32
# torch.addmm(..., out_dtype=) (a low-precision product accumulated in an fp32 output): torch >= 2.8, CUDA.
_ADDMM_OUT_DTYPE = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


def chunk_rows(device: str, n: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of the fused output layer (eager mode).

    On the CPU, ``max(16, 2**22 // vocab)`` rows, whatever ``n`` and ``hidden``: about 4M logits
    (16 MiB in fp32) a chunk, held in cache. On an accelerator, Liger-Kernel's rule (Hsu et al.
    2024; ``fused_linear_cross_entropy_forward`` in ``liger_kernel/ops/fused_linear_cross_entropy.py``):
    ``inc = ceil(vocab / hidden)`` chunks, so that a chunk's ``(rows, vocab)`` logits are about the
    size of the ``(n, hidden)`` input, the rows rounded up to a power of two,
    ``next_power_of_2(ceil(n / inc))``, and at most ``n``: few large matmuls, each adding one
    ``vocab x hidden`` product into the weight gradient.

    Args:
        device: the device type of the rows (``"cpu"``, ``"cuda"``, ...).
        n: rows (target positions) of the call, ``>= 0``.
        vocab: rows of the output layer ``V``, ``>= 1``.
        hidden: its width ``d_model``, ``>= 1``.

    Returns:
        Rows per chunk, ``>= 1`` (the last chunk holds the remainder).
    """
    if device == "cpu":
        return max(16, _CPU_CHUNK_LOGITS // max(vocab, 1))
    inc = -(-vocab // max(hidden, 1))  # ceil(V / H)
    rows = -(-n // max(inc, 1))  # ceil(N / inc)
    return max(1, min(1 << max(rows - 1, 0).bit_length(), n))  # next power of two, at most N


def compiled_chunks(vocab: int, hidden: int) -> int:
    """Chunks of the fused output layer under ``torch.compile``: ``ceil(vocab / hidden)`` (Liger's
    count, see :func:`chunk_rows`), at most 32 (each chunk is traced into the graph).

    A fixed count rather than rows per chunk: the rows ``N`` are a symbol of the graph, and a loop
    over a count that depends on ``N`` would guard on its value (a recompilation per batch shape).
    """
    return max(1, min(_MAX_COMPILED_CHUNKS, math.ceil(vocab / max(hidden, 1))))


def _accumulate_grad_w(grad_w: Tensor, g: Tensor, h: Tensor) -> None:
    """``grad_w += g.T @ h`` in place: ``grad_w`` ``(V, d)`` fp32, ``g`` ``(C, V)`` and ``h`` ``(C, d)`` in
    the compute dtype.

    fp32: one ``addmm_`` (beta = 1, the sum in the matmul). bf16/fp16 on CUDA: the same with an fp32
    output (``out_dtype``: no 16-bit product, no fp32 copy of it, the product never rounded to 16
    bits). Elsewhere (the CPU has no ``out_dtype`` kernel; under ``torch.compile`` the compiler fuses
    the cast into the add) the 16-bit ``(V, d)`` product is cast to fp32 and added.
    """
    if g.dtype == torch.float32:
        grad_w.addmm_(g.t(), h)
    elif (
        _ADDMM_OUT_DTYPE
        and g.is_cuda
        and not torch.compiler.is_compiling()  # an out= variant with out_dtype: left to the compiler
        and torch.cuda.get_device_capability(g.device)[0] >= 8
    ):
        torch.addmm(grad_w, g.t(), h, out_dtype=torch.float32, out=grad_w)
    else:
        grad_w += torch.mm(g.t(), h).float()


class _LinearLabelSmoothedLoss(torch.autograd.Function):
    """``sum_i loss_i(hidden_i @ weight.T)`` without materialising the ``(N, V)`` logits.

    The forward pass walks over row chunks: logits of a chunk (in cache), its log-sum-exp, the
    smoothed loss and NLL, then the gradient ``softmax - target_distribution`` of the chunk, which
    is multiplied straight away into the gradients of ``hidden`` and ``weight`` (Liger-Kernel's
    fused linear cross entropy, Hsu et al. 2024). The backward pass only scales them by the
    incoming gradient. The same three matmuls as ``F.linear`` + loss, but no ``(N, V)`` tensor
    (and its log-softmax, gather and mean backward passes) ever goes through memory. The chunks are
    :func:`chunk_rows` rows each in eager mode (the CPU's cache-sized rule, Liger's rule on an
    accelerator), and :func:`compiled_chunks` chunks of equal size under ``torch.compile``.

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
        if torch.compiler.is_compiling():
            # N is a symbol of the graph: a fixed count of chunks of one symbolic size, the rows padded
            # to chunks * size with masked rows (chunks of unequal sizes would guard on N's value,
            # and chunks of size 0 or 1 are specialised: recompilations per batch shape)
            chunks = compiled_chunks(vocab, weight.shape[1])
            step = (n + chunks - 1) // chunks
            pad = step * chunks - n
            keep = F.pad(torch.ones_like(target, dtype=torch.bool) if keep is None else keep, (0, pad))
            hidden, target = F.pad(hidden, (0, 0, 0, pad)), F.pad(target, (0, pad))
            spans = [(i * step, step) for i in range(chunks)]
        else:
            step = chunk_rows(device, n, vocab, weight.shape[1])
            spans = [(lo, min(step, n - lo)) for lo in range(0, n, step)]
        grad_h = torch.empty_like(hidden) if need_grad else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grad else None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.autocast(device, enabled=False):
            if keep is not None:  # masked rows: a valid class index, zero hidden rows for the weight gradient
                target = target.masked_fill(~keep, 0)
                hidden = hidden.masked_fill(~keep[:, None], 0.0)
            hidden_c, weight_c = hidden.to(cdt), weight.to(cdt)
            for lo, size in spans:
                h = hidden_c.narrow(0, lo, size)  # (C, d)
                y = target.narrow(0, lo, size)[:, None]  # (C, 1)
                lprobs = torch.log_softmax(torch.mm(h, weight_c.t()).float(), 1)  # (C, V) fp32
                picked, spread = lprobs.gather(1, y).squeeze(1), lprobs.mean(1)  # (C,), (C,)
                if keep is not None:
                    k = keep.narrow(0, lo, size)
                    picked, spread = picked.masked_fill(~k, 0.0), spread.masked_fill(~k, 0.0)
                nll = -picked.sum()
                nll_sum += nll
                loss += (1.0 - epsilon) * nll - epsilon * spread.sum()
                if not need_grad:
                    continue
                # d loss_i / d z = softmax - (1 - eps) * onehot(y) - eps / V: the softmax part goes
                # through the matmuls, the two constant parts are added on (C, d) / (V, d) below
                g = lprobs.exp_().to(cdt)  # (C, V)
                rows = grad_h.narrow(0, lo, size)
                if grad_h.dtype == cdt:
                    torch.mm(g, weight_c, out=rows)
                else:
                    rows.copy_(torch.mm(g, weight_c))
                rows.sub_(weight[y[:, 0]].to(rows.dtype), alpha=1.0 - epsilon)  # onehot part
                _accumulate_grad_w(grad_w, g, h)
            if need_grad:
                grad_w.index_add_(0, target, hidden.float(), alpha=-(1.0 - epsilon))  # onehot part
                if epsilon > 0.0:  # uniform part: -eps / V for every class
                    grad_h.sub_(weight.float().sum(0).to(grad_h.dtype), alpha=epsilon / vocab)
                    grad_w.sub_(hidden.float().sum(0), alpha=epsilon / vocab)
                if keep is not None:
                    grad_h.masked_fill_(~keep[:, None], 0.0)
                grad_h = grad_h.narrow(0, 0, n)  # without the compiled call's padding rows
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


__all__ = ["chunk_rows", "compiled_chunks", "linear_label_smoothed_loss"]
