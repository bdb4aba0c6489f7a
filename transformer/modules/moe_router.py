"""The router of a mixture of experts: token-choice top-k routing (:class:`TopKRouter`), its decision
(:class:`Routing`) and the ``model.ffn.router`` switch (:data:`ROUTER_SCORES`). ``softmax`` scores
with renormalised top-k weights are Mixtral's (Jiang et al. 2024); ``sigmoid`` with a selection
bias, nudged after each update, DeepSeek-V3's (DeepSeek-AI 2024 §2.1.2, eqs. 12-16).

Shapes: ``N`` tokens (``batch * seq_len``), ``E`` = ``n_experts``, ``k`` = ``top_k``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ROUTER_SCORES", "RouterScoring", "Routing", "TopKRouter"]


@dataclass(frozen=True)
class RouterScoring:
    """One option of ``model.ffn.router``: ``scores``, ``(N, E)`` fp32 logits -> ``(N, E)`` scores, and
    whether a token's scores already sum to 1 (``sums_to_one``; else the balance loss normalises them)."""

    scores: Callable[[Tensor], Tensor]
    sums_to_one: bool


def _softmax(logits: Tensor) -> Tensor:
    return logits.softmax(dim=-1)


# model.ffn.router=<name> -> RouterScoring
ROUTER_SCORES: dict[str, RouterScoring] = {
    "softmax": RouterScoring(_softmax, sums_to_one=True),  # Switch, Mixtral
    "sigmoid": RouterScoring(torch.sigmoid, sums_to_one=False),  # DeepSeek-V3
}


@dataclass
class Routing:
    """What the router decided for ``N`` tokens.

    Attributes:
        logits: ``(N, E)`` fp32 router logits.
        scores: ``(N, E)`` fp32 scores (softmax probabilities or sigmoid affinities).
        experts: ``(N, k)`` int64 chosen experts, distinct per token.
        weights: ``(N, k)`` fp32 weights of the chosen experts' outputs.
    """

    logits: Tensor
    scores: Tensor
    experts: Tensor
    weights: Tensor


class TopKRouter(nn.Module):
    """Token-choice top-k routing: ``experts = topk(scores + expert_bias)``, ``weights =
    scores[experts]``, renormalised when ``norm_topk_prob``, times ``routed_scaling_factor``.

    Logits are fp32, also under autocast. ``expert_bias`` (a saved buffer) enters only the selection
    (DeepSeek-V3 eq. 16) and stays 0 unless :meth:`update_bias` moves it.

    Args:
        gate: Linear ``d_model -> n_experts`` without bias (HF ``gate.weight``).
        top_k: experts per token (HF ``num_experts_per_tok``), in ``[1, n_experts]``.
        routed_scaling_factor: multiplies the weights (DeepSeek-V3: 2.5).
        bias_update_speed: ``gamma`` of :meth:`update_bias` (DeepSeek-V3: 0.001; 0: off).

    Raises:
        ValueError: a gate with a bias, or ``top_k`` outside ``[1, n_experts]``.
    """

    def __init__(
        self,
        *,
        gate: nn.Linear,
        scoring: RouterScoring,
        top_k: int,
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 1.0,
        bias_update_speed: float = 0.0,
    ) -> None:
        super().__init__()
        n_experts = gate.out_features
        if gate.bias is not None:
            raise ValueError("the router's gate must not have a bias")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and the number of experts ({n_experts})")
        self.gate, self.scoring, self.top_k = gate, scoring, int(top_k)
        self.n_experts = n_experts
        self.norm_topk_prob, self.routed_scaling_factor = bool(norm_topk_prob), float(routed_scaling_factor)
        self.bias_update_speed = float(bias_update_speed)
        self.register_buffer("expert_bias", torch.zeros(n_experts, dtype=torch.float32))

    def forward(self, x: Tensor) -> Routing:
        """Route ``x`` ``(N, d_model)``; see :class:`Routing`."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.gate.weight.float())  # (N, E)
        scores = self.scoring.scores(logits)
        experts = (scores.detach() + self.expert_bias).topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        return Routing(logits=logits, scores=scores, experts=experts, weights=weights)

    @torch.no_grad()
    def update_bias(self, load: Tensor) -> None:
        """DeepSeek-V3's auxiliary-loss-free balance: ``expert_bias_i += gamma * sign(mean(load) - load_i)``
        from the ``(E,)`` tokens per expert of the whole update (all micro-batches and ranks)."""
        if self.bias_update_speed > 0:
            load = load.to(self.expert_bias.device, torch.float32)
            self.expert_bias.add_(torch.sign(load.mean() - load), alpha=self.bias_update_speed)
