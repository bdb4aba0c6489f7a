"""The output layer fused with the label-smoothed cross entropy (Liger-Kernel's fused linear cross
entropy, Hsu et al. 2024): ``sum_i loss_i(hidden_i @ weight.T)`` without the ``(N, V)`` logits, per
row ``(1 - eps) * (-log p_i[y_i]) + eps * mean_c(-log p_i[c])``. Chunking and the gradient:
docs/design.md#the-fused-output-layer-and-loss."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# Logits per chunk on the CPU: ~4M (16 MiB in fp32), a chunk's logits and log-probabilities staying
# in the cache between the matmul that writes them and the matmuls that read them back.
_CPU_CHUNK_LOGITS = 1 << 22
# Logits per chunk on an accelerator: 128M (512 MiB in fp32, plus their 16-bit gradient), so that a
# 16k-row batch of a 32k vocabulary takes 4 chunks: each chunk is ~15 kernel launches, and an eager
# GPU step is bound by its launches, not by this memory.
_DEVICE_CHUNK_LOGITS = 1 << 27
# Rows of an accelerator's chunk are a multiple of this (whole tensor-core tiles).
_DEVICE_ROW_MULTIPLE = 128
# Chunks of a call under torch.compile: every chunk is traced into the graph, so their number is
# capped (the graph's size and compile time grow with it); 32 keeps a chunk's fp32 logits at
# 1/32 of the (N, V) tensor.
_MAX_COMPILED_CHUNKS = 32
# torch.addmm(..., out_dtype=) with an fp32 input and output and bf16/fp16 matrices: torch >= 2.10
# (pytorch#167931; 2.8 and 2.9 have out_dtype but raise "self and mat2 must have the same dtype").
_ADDMM_OUT_DTYPE_SINCE = (2, 10)


def _torch_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``2.13.0+cpu``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def addmm_out_dtype_available(version: str | None = None) -> bool:
    """Whether this torch (or ``version``) has ``torch.addmm(fp32, bf16, bf16, out_dtype=float32)``."""
    return _torch_version(version or torch.__version__) >= _ADDMM_OUT_DTYPE_SINCE


def chunk_rows(device: str, n: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of the fused output layer in eager mode (the last chunk holds the remainder):
    ``max(16, 2**22 // vocab)`` on the CPU, ``2**27 // vocab`` (a multiple of 128, at most ``n``) on an
    accelerator."""
    if device == "cpu":
        return max(16, _CPU_CHUNK_LOGITS // max(vocab, 1))
    rows = max(
        _DEVICE_ROW_MULTIPLE, _DEVICE_CHUNK_LOGITS // max(vocab, 1) // _DEVICE_ROW_MULTIPLE * _DEVICE_ROW_MULTIPLE
    )
    return max(1, min(rows, n))


def compiled_chunks(vocab: int, hidden: int) -> int:
    """Chunks under ``torch.compile``: ``ceil(vocab / hidden)``, at most 32 (a count, not rows: no guard on ``N``)."""
    return max(1, min(_MAX_COMPILED_CHUNKS, math.ceil(vocab / max(hidden, 1))))


def _accumulate_grad_w(grad_w: Tensor, g: Tensor, h: Tensor) -> None:
    """``grad_w += g.T @ h`` in place: ``grad_w`` ``(V, d)`` fp32, ``g`` ``(C, V)`` and ``h`` ``(C, d)``
    in the compute dtype, never rounded to 16 bits."""
    if g.dtype == torch.float32:
        grad_w.addmm_(g.t(), h)
    elif (
        addmm_out_dtype_available()
        and g.is_cuda
        and not torch.compiler.is_compiling()  # an out= variant with out_dtype: left to the compiler
        and torch.cuda.get_device_capability(g.device)[0] >= 8
    ):
        torch.addmm(grad_w, g.t(), h, out_dtype=torch.float32, out=grad_w)
    else:
        grad_w += torch.mm(g.t(), h).float()


class _LinearLabelSmoothedLoss(torch.autograd.Function):
    """``sum_i loss_i(hidden_i @ weight.T)`` without the ``(N, V)`` logits: the gradients are computed
    chunk by chunk in the forward pass and scaled in the backward; rows where ``keep`` is False add
    nothing and get zero gradient."""

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
        picked, spread = [], []  # (C, 1) log p[y] and mean log p of each chunk, summed once at the end
        with torch.autocast(device, enabled=False):
            if keep is not None:  # masked rows: a valid class index, zero hidden rows for the weight gradient
                target = target.masked_fill(~keep, 0)
                hidden = hidden.masked_fill(~keep[:, None], 0.0)
            hidden_c, weight_c = hidden.to(cdt), weight.to(cdt)
            weight_t, y = weight_c.t(), target[:, None]  # (d, V), (N, 1)
            for lo, size in spans:
                h = hidden_c.narrow(0, lo, size)  # (C, d)
                lprobs = torch.log_softmax(torch.mm(h, weight_t).float(), 1)  # (C, V) fp32
                picked.append(lprobs.gather(1, y.narrow(0, lo, size)))
                spread.append(lprobs.mean(1, keepdim=True))
                if not need_grad:
                    continue
                # d loss_i / d z = softmax - (1 - eps) * onehot(y) - eps / V: the softmax part goes
                # through the matmuls, the two constant parts are added on (N, d) / (V, d) below
                g = lprobs.exp_().to(cdt)  # (C, V)
                rows = grad_h.narrow(0, lo, size)
                if grad_h.dtype == cdt:
                    torch.mm(g, weight_c, out=rows)
                else:
                    rows.copy_(torch.mm(g, weight_c))
                _accumulate_grad_w(grad_w, g, h)
            if not picked:  # no rows at all
                picked, spread = (
                    [hidden_c.new_zeros((0, 1), dtype=torch.float32)],
                    [hidden_c.new_zeros((0, 1), dtype=torch.float32)],
                )
            picked_all, spread_all = torch.cat(picked).squeeze(1), torch.cat(spread).squeeze(1)  # (N,)
            if keep is not None:
                picked_all, spread_all = picked_all.masked_fill(~keep, 0.0), spread_all.masked_fill(~keep, 0.0)
            nll_sum = -picked_all.sum()
            loss = (1.0 - epsilon) * nll_sum - epsilon * spread_all.sum()
            if need_grad:
                grad_h.sub_(weight.index_select(0, target).to(grad_h.dtype), alpha=1.0 - epsilon)  # onehot part
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
        hidden: ``(N, d_model)``, contiguous.
        weight: ``(vocab, d_model)``.
        target: ``(N,)`` class indices (any value where ``keep`` is False).
        keep: optional ``(N,)`` bool, True at the rows that take a loss.

    Returns:
        ``(loss_sum, nll_sum)``, fp32 scalars in nats; only ``loss_sum`` is differentiable.
    """
    return _LinearLabelSmoothedLoss.apply(hidden, weight, target, float(epsilon), keep)


__all__ = ["addmm_out_dtype_available", "chunk_rows", "compiled_chunks", "linear_label_smoothed_loss"]
