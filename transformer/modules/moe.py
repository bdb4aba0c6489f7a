"""Mixture of experts (``model/ffn=moe``): a token-choice top-k router
(:mod:`~transformer.modules.moe_router`), routed experts that each process only the tokens sent to
them (:class:`GroupedExperts`: dropless, one grouped matmul per weight matrix, or a dense dispatch
under ``torch.compile`` where ``grouped_mm`` is not traced), optional shared experts, and the
statistics of the last forward pass over the real tokens (:class:`RouterStats`) from which
:mod:`~transformer.modules.moe_losses` builds the router losses. References: Switch Transformer
(Fedus et al. 2021), Mixtral (Jiang et al. 2024), DeepSeek-V3 (DeepSeek-AI 2024); the design
(dispatch, losses, padding) is in ``docs/architectures.md``, "Mixture of experts".

Shapes: ``N`` is the number of tokens (``batch * seq_len`` flattened), ``E`` = ``n_experts``,
``k`` = ``top_k``.
"""

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

    Gated (``w2(act(x W_gate) * (x W_up))``, SwiGLU/GEGLU) or two-matrix (``w2(act(x W_1))``),
    like :class:`~transformer.modules.ffn.GatedFeedForward` / :class:`~transformer.modules.ffn.FeedForward`
    per expert. Parameters: ``w13`` ``(E, 2 * hidden, d_model)`` (gate rows first; HF
    ``gate_up_proj``) or ``w1`` ``(E, hidden, d_model)``, and ``w2`` ``(E, d_model, hidden)`` (HF
    ``down_proj``); with ``bias``, ``b13``/``b1`` and ``b2``. They start uninitialised: the builder
    calls :meth:`reset_parameters`.

    Args:
        n_experts: number of experts ``E``.
        d_model: model width.
        hidden: each expert's hidden width.
        activation: elementwise function (``F.silu`` for SwiGLU).
        gated: three matrices per expert (GLU) instead of two.
        bias: biases in the experts' linear maps.
        dropout: activation dropout on the hidden units.
        dispatch: ``"grouped_mm"`` (one ``F.grouped_mm`` per matrix), ``"loop"`` (a loop over the
            experts), ``"dense"`` (every expert on every row, :meth:`dense`) or ``"auto"``
            (grouped_mm where torch has a kernel for the device and dtype: CPU fp32/bf16, CUDA bf16;
            else the loop). Under ``torch.compile`` it is always grouped_mm where it traces (bf16
            with a kernel), else dense: the loop cannot be traced, and grouped_mm's meta function
            accepts bf16 only.

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
        """Initialise each expert's matrices as the builder initialises a Linear weight: ``init_matrix``
        on every ``(out, in)`` slice (so Xavier sees one expert's fans), biases to zero."""
        for w in (getattr(self, self.in_name), self.w2):
            for e in range(self.n_experts):
                init_matrix(w[e])
        for b in (getattr(self, self.b_in_name), self.b2):
            if b is not None:
                b.zero_()

    def path(self, x: Tensor) -> str:
        """The dispatch that runs for rows like ``x`` now: ``grouped_mm``, ``loop`` or ``dense``
        (see ``dispatch``; under ``torch.compile`` grouped_mm where it traces, else dense)."""
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
        """Every expert on every row, each row keeping its chosen experts' outputs: fixed shapes,
        no host sync (the traceable dispatch; ``n_experts / top_k`` times the work of the others).

        Args:
            x: ``(N, d_model)`` rows in token order.
            experts: ``(N, k)`` int64 the experts of each row.

        Returns:
            ``(N, k, d_model)``: row ``n``'s output of its ``j``-th expert at ``[n, j]``.
        """
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
        """Apply expert ``e`` to its rows (by ``grouped_mm`` or the loop; :meth:`dense` takes the
        rows in token order instead).

        Args:
            x: ``(M, d_model)`` rows sorted by expert: ``counts[0]`` rows for expert 0, then expert 1, ...
            counts: ``(E,)`` int64 rows per expert (``counts.sum() == M``).

        Returns:
            ``(M, d_model)``, row ``i`` the output of the expert of row ``i``.
        """
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
    """What one MoE block saw in its last forward pass (read by
    :func:`~transformer.modules.moe_losses.router_losses`).

    Everything but ``dropped`` counts the real tokens only (``token_mask`` of
    :meth:`MixtureOfExperts.forward`; all ``N`` tokens without one).

    Attributes:
        tokens: real tokens routed: ``N`` (an int) without a token mask, else a ``()`` int64 tensor
            (read without a host sync).
        load: ``(E,)`` int64 assignments of real tokens per expert (each token counts once per
            chosen expert, so ``load.sum() == top_k * tokens``).
        dropped: assignments no expert processed (0: the dispatch is dropless).
        prob_sum: ``(E,)`` the balance loss's router probabilities summed over the real tokens
            (differentiable); None outside training.
        z_sum: ``()`` ``sum_real_tokens logsumexp(logits)^2`` (differentiable); None outside training.
    """

    tokens: int | Tensor
    load: Tensor
    dropped: int
    prob_sum: Tensor | None
    z_sum: Tensor | None


class MixtureOfExperts(nn.Module):
    """A sparse feed-forward block: ``y = shared(x) + sum_{e in topk(x)} weight_e(x) * expert_e(x)``.

    The drop-in replacement of a feed-forward block in any layer of either model family. Tokens
    are routed independently, padding positions too (dropless, so they take nothing from the real
    tokens), but the statistics, hence the router losses and the bias update, leave out the
    positions the ``token_mask`` marks as padding, as HF's ``load_balancing_loss_func`` given an
    ``attention_mask`` (huggingface/transformers#28517). After each forward pass ``self.stats``
    holds the :class:`RouterStats`.

    Args:
        router: the :class:`TopKRouter`.
        experts: the routed :class:`GroupedExperts` (as many as the router has outputs).
        shared_experts: an always-applied feed-forward block (DeepSeek's ``n_shared_experts``
            experts as one block of their summed width), or None.
        aux_loss_coef: weight of the load-balancing loss in the training loss (``router_aux_loss_coef``).
        z_loss_coef: weight of the router z-loss (``router_z_loss_coef``).

    Raises:
        ValueError: when the router and the experts disagree on the number of experts.
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
        """Route and apply the experts to every position of ``x``.

        Args:
            x: ``(batch, seq_len, d_model)`` (any leading shape).
            token_mask: ``(batch, seq_len)`` bool (``x``'s leading shape), True at real tokens,
                False at padding; None when every position is a real token (no extra work then).

        Returns:
            ``(batch, seq_len, d_model)``; ``self.stats`` holds the real tokens' :class:`RouterStats`.

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
        """The :class:`RouterStats` of ``route`` over the real tokens (``real``: ``(N,)`` bool, or
        None for all); masked by multiplication, without a host sync."""
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
