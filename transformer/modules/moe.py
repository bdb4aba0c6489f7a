"""Mixture of experts (``model/ffn=moe``): a token-choice top-k router, dropless routed experts
(grouped matmuls, a loop, or a dense dispatch under ``torch.compile``), optional shared experts, and
the statistics the router losses are built from. Switch Transformer (Fedus et al. 2021), Mixtral
(Jiang et al. 2024), DeepSeek-V3 (DeepSeek-AI 2024); the design: docs/architectures.md#mixture-of-experts.

Shapes: ``N`` tokens (``batch * seq_len``), ``E`` = ``n_experts``, ``k`` = ``top_k``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.modules.dropout import Dropout
from transformer.modules.moe_router import Routing, TopKRouter

__all__ = [
    "DISPATCHES",
    "GroupedExperts",
    "MixtureOfExperts",
    "RouterStats",
]


# grouped_mm's kernels by device: CPU (fp32, bf16), CUDA (bf16, SM >= 80); elsewhere the loop.
# Under torch.compile its meta function accepts bf16 only.
_GROUPED_MM_DTYPES = {"cpu": (torch.float32, torch.bfloat16), "cuda": (torch.bfloat16,)}

DISPATCHES = ("auto", "grouped_mm", "loop", "dense")
"""The ``dispatch`` choices of :class:`GroupedExperts`."""


class GroupedExperts(nn.Module):
    """``n_experts`` feed-forward blocks with stacked weights, applied to rows grouped by expert.

    Gated (``w2(act(x W_gate) * (x W_up))``) or two-matrix (``w2(act(x W_1))``) per expert. Weights
    ``w13`` ``(E, 2 * hidden, d_model)`` (gate rows first, HF ``gate_up_proj``) or ``w1`` ``(E, hidden,
    d_model)``, and ``w2`` ``(E, d_model, hidden)`` (HF ``down_proj``); uninitialised until
    :meth:`reset_parameters`.

    Args:
        dispatch: ``grouped_mm`` (one ``F.grouped_mm`` per matrix), ``loop``, ``dense`` (:meth:`dense`)
            or ``auto`` (grouped_mm where torch has a kernel: CPU fp32/bf16, CUDA bf16; else the loop).
            Under ``torch.compile``: grouped_mm in bf16 with a kernel, else dense.

    Raises:
        ValueError: non-positive sizes or an unknown ``dispatch``.
    """

    def __init__(
        self,
        *,
        n_experts: int,
        d_model: int,
        hidden: int,
        activation: Callable[[Tensor], Tensor],
        gated: bool,
        bias: bool = False,
        dropout: float = 0.0,
        dispatch: str = "auto",
    ) -> None:
        super().__init__()
        if min(n_experts, d_model, hidden) <= 0:
            raise ValueError(f"n_experts={n_experts}, d_model={d_model} and hidden={hidden} must be positive")
        if dispatch not in DISPATCHES:
            raise ValueError(f"dispatch={dispatch!r} is not one of {', '.join(DISPATCHES)}")
        self.n_experts, self.d_model, self.hidden, self.gated = n_experts, d_model, hidden, bool(gated)
        self.n_matrices = 3 if gated else 2  # d_model x hidden matrices per expert
        self.activation, self.dispatch = activation, dispatch
        self.dropout = Dropout(dropout)
        width = (2 if gated else 1) * hidden
        self.in_name = "w13" if gated else "w1"
        self.register_parameter(self.in_name, nn.Parameter(torch.empty(n_experts, width, d_model)))
        self.w2 = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.b_in_name = "b13" if gated else "b1"
        self.register_parameter(self.b_in_name, nn.Parameter(torch.zeros(n_experts, width)) if bias else None)
        self.b2 = nn.Parameter(torch.zeros(n_experts, d_model)) if bias else None

    @property
    def parameters_per_expert(self) -> int:
        """Parameters of one expert (weights and biases)."""
        return sum(p.numel() for p in self.parameters()) // self.n_experts

    @torch.no_grad()
    def reset_parameters(self, init_matrix: Callable[[Tensor], object]) -> None:
        """``init_matrix`` on every expert's ``(out, in)`` slice (so Xavier sees one expert's fans),
        biases to zero."""
        for w in (getattr(self, self.in_name), self.w2):
            for e in range(self.n_experts):
                init_matrix(w[e])
        for b in (getattr(self, self.b_in_name), self.b2):
            if b is not None:
                b.zero_()

    def path(self, x: Tensor) -> str:
        """The dispatch that runs for rows like ``x`` now: ``grouped_mm``, ``loop`` or ``dense``."""
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        kernel = hasattr(F, "grouped_mm") and dtype in _GROUPED_MM_DTYPES.get(device, ())
        if torch.compiler.is_compiling():
            return "grouped_mm" if kernel and dtype == torch.bfloat16 else "dense"
        if self.dispatch != "auto":
            return self.dispatch
        return "grouped_mm" if kernel else "loop"

    def _hidden(self, h: Tensor) -> Tensor:
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.activation(gate) * up
        else:
            h = self.activation(h)
        return self.dropout(h)

    def dense(self, x: Tensor, experts: Tensor) -> Tensor:
        """Every expert on every row, ``(N, d_model)`` in token order with ``(N, k)`` choices -> ``(N, k,
        d_model)``: fixed shapes and no host sync, at ``n_experts / top_k`` times the work."""
        w_in, b_in = getattr(self, self.in_name), getattr(self, self.b_in_name)
        h = torch.matmul(x, w_in.transpose(1, 2))  # (E, N, width)
        if b_in is not None:
            h = h + b_in[:, None, :]
        y = torch.matmul(self._hidden(h), self.w2.transpose(1, 2))  # (E, N, d_model)
        if self.b2 is not None:
            y = y + self.b2[:, None, :]
        rows = torch.arange(x.shape[0], device=x.device)[:, None]  # (N, 1)
        return y[experts, rows]  # (N, k, d_model)

    def forward(self, x: Tensor, counts: Tensor) -> Tensor:
        """Apply each expert to its rows: ``(M, d_model)`` sorted by expert, ``counts`` ``(E,)`` rows
        per expert -> ``(M, d_model)``."""
        w_in, b_in = getattr(self, self.in_name), getattr(self, self.b_in_name)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        if self.path(x) == "grouped_mm":
            offs = counts.cumsum(0).to(torch.int32)  # end row of each expert
            x = x.to(dtype)
            h = F.grouped_mm(x, w_in.to(dtype).transpose(1, 2), offs=offs)  # (M, width)
            if b_in is not None:
                h = h + b_in.to(dtype).repeat_interleave(counts, dim=0, output_size=x.shape[0])
            y = F.grouped_mm(self._hidden(h), self.w2.to(dtype).transpose(1, 2), offs=offs)  # (M, d_model)
            if self.b2 is not None:
                y = y + self.b2.to(dtype).repeat_interleave(counts, dim=0, output_size=x.shape[0])
            return y
        outputs = []
        for e, rows in enumerate(x.split(counts.tolist())):
            if rows.shape[0]:
                h = self._hidden(F.linear(rows, w_in[e], None if b_in is None else b_in[e]))
                outputs.append(F.linear(h, self.w2[e], None if self.b2 is None else self.b2[e]))
        return torch.cat(outputs) if outputs else x.new_zeros(0, self.d_model)


@dataclass
class RouterStats:
    """What one MoE block saw in its last forward pass, over the real tokens only (except ``dropped``).

    Attributes:
        tokens: real tokens routed (an int, or a ``()`` int64 tensor with a token mask).
        load: ``(E,)`` int64 assignments per expert (``load.sum() == top_k * tokens``).
        dropped: assignments no expert processed (0: dropless).
        prob_sum: ``(E,)`` router probabilities summed over the tokens (differentiable); None in eval.
        z_sum: ``()`` ``sum logsumexp(logits)^2`` (differentiable); None in eval.
    """

    tokens: int | Tensor
    load: Tensor
    dropped: int
    prob_sum: Tensor | None
    z_sum: Tensor | None


class MixtureOfExperts(nn.Module):
    """A sparse feed-forward block: ``y = shared(x) + sum_{e in topk(x)} weight_e(x) * expert_e(x)``.

    Padding positions are routed too (dropless, so they take nothing from the real tokens), but the
    statistics leave them out, as HF's ``load_balancing_loss_func`` with an ``attention_mask``.

    Raises:
        ValueError: the router and the experts disagree on the number of experts.
    """

    def __init__(
        self,
        *,
        router: TopKRouter,
        experts: GroupedExperts,
        shared_experts: nn.Module | None = None,
        aux_loss_coef: float = 0.0,
        z_loss_coef: float = 0.0,
    ) -> None:
        super().__init__()
        if router.n_experts != experts.n_experts:
            raise ValueError(f"the router scores {router.n_experts} experts but there are {experts.n_experts}")
        self.router, self.experts, self.shared_experts = router, experts, shared_experts
        self.aux_loss_coef, self.z_loss_coef = float(aux_loss_coef), float(z_loss_coef)
        self.stats: RouterStats | None = None

    def forward(self, x: Tensor, token_mask: Tensor | None = None) -> Tensor:
        """``(batch, seq_len, d_model)`` -> the same; ``self.stats`` then holds the :class:`RouterStats`.

        ``token_mask`` is ``(batch, seq_len)`` bool, True at real tokens; None when all are real.

        Raises:
            ValueError: a ``token_mask`` whose shape is not ``x``'s without the last dimension.
        """
        shape = x.shape
        if token_mask is not None and tuple(token_mask.shape) != tuple(shape[:-1]):
            raise ValueError(
                f"token_mask shape {tuple(token_mask.shape)} must be x's without d_model, {tuple(shape[:-1])}"
            )
        h = x.reshape(-1, shape[-1])  # (N, d)
        n, k = h.shape[0], self.router.top_k
        route = self.router(h)
        flat = route.experts.reshape(-1)  # (N * k,): token t's j-th choice at t * k + j
        counts = torch.zeros(self.experts.n_experts, dtype=torch.long, device=h.device).scatter_add_(
            0, flat, torch.ones_like(flat)
        )  # (E,) assignments per expert (bincount's shape depends on the values)
        if self.experts.path(h) == "dense":
            y = self.experts.dense(h, route.experts)  # (N, k, d)
        else:
            order = flat.argsort(stable=True)  # assignments grouped by expert
            y = self.experts(h.index_select(0, order // k), counts)  # (N * k, d), in expert order
            y = torch.empty_like(y).index_copy_(0, order, y).view(n, k, -1)  # back in token order
        processed = y.shape[0] * y.shape[1]
        out = (y * route.weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)  # (N, d)
        if self.shared_experts is not None:
            out = out + self.shared_experts(h)
        self.stats = self._stats(
            route, counts, n * k - processed, None if token_mask is None else token_mask.reshape(-1)
        )
        return out.view(shape)

    def _stats(self, route: Routing, counts: Tensor, dropped: int, real: Tensor | None) -> RouterStats:
        """The :class:`RouterStats` of ``route`` over the real tokens, masked without a host sync."""
        tokens: int | Tensor = route.experts.shape[0]
        load = counts
        if real is not None:
            tokens = real.sum()
            per_choice = real.to(counts.dtype).repeat_interleave(self.router.top_k)  # (N * k,) like experts.reshape(-1)
            load = torch.zeros_like(counts).scatter_add_(0, route.experts.reshape(-1), per_choice)
        prob_sum = z_sum = None
        if self.training:
            probs = (
                route.scores if self.router.scoring.sums_to_one else route.scores / route.scores.sum(-1, keepdim=True)
            )
            z = torch.logsumexp(route.logits, dim=-1).square()  # (N,)
            if real is not None:
                probs, z = probs.masked_fill(~real[:, None], 0.0), z.masked_fill(~real, 0.0)
            prob_sum, z_sum = probs.sum(dim=0), z.sum()
        return RouterStats(tokens=tokens, load=load.detach(), dropped=dropped, prob_sum=prob_sum, z_sum=z_sum)
