"""The router losses of a model's mixture-of-experts blocks after a forward pass, per stack over the
real tokens: Switch Transformer's load-balancing loss (Fedus et al. 2021 eq. 4) as Hugging Face's
``load_balancing_loss_func`` computes it with an ``attention_mask``, and ST-MoE's z-loss (Zoph et
al. 2022 eq. 5); and DeepSeek-V3's bias update (DeepSeek-AI 2024 §2.1.2).
docs/architectures.md#mixture-of-experts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer.modules.layers import TransformerStack
from transformer.modules.moe import MixtureOfExperts

__all__ = ["RouterLosses", "moe_blocks", "router_losses", "update_expert_biases"]


def moe_blocks(module: nn.Module) -> list[MixtureOfExperts]:
    """The :class:`MixtureOfExperts` blocks inside ``module``, in ``module.modules()`` order."""
    return [m for m in module.modules() if isinstance(m, MixtureOfExperts)]


@dataclass
class RouterLosses:
    """The router losses of a model's last training forward pass.

    Attributes:
        aux_loss, z_loss: ``()`` summed over the stacks, unweighted.
        weighted: ``()`` ``aux_loss_coef * aux_loss + z_loss_coef * z_loss``, added per target token.
        load: ``(n_moe_layers, E)`` int64 real-token assignments per expert (detached), :func:`moe_blocks` order.
        dropped: assignments no expert processed (0).
    """

    aux_loss: Tensor
    z_loss: Tensor
    weighted: Tensor
    load: Tensor
    dropped: int


def _stack_losses(blocks: list[MixtureOfExperts]) -> tuple[Tensor, Tensor, Tensor]:
    """``(aux, z, weighted)`` of the blocks of one stack, their tokens taken together."""
    first = blocks[0]
    if any(
        (b.experts.n_experts, b.aux_loss_coef, b.z_loss_coef)
        != (first.experts.n_experts, first.aux_loss_coef, first.z_loss_coef)
        for b in blocks
    ):
        raise ValueError("the MoE blocks of one stack must share n_experts and the loss coefficients")
    stats = [b.stats for b in blocks]
    rows = sum(s.tokens for s in stats)  # real tokens over the layers (an int, or a tensor when masked)
    f = torch.stack([s.load for s in stats]).sum(0).float() / rows  # (E,) fraction of tokens per expert (sums to top_k)
    p = torch.stack([s.prob_sum for s in stats]).sum(0) / rows  # (E,) mean router probability (sums to 1)
    aux = first.experts.n_experts * (f * p).sum()
    z = torch.stack([s.z_sum for s in stats]).sum() / rows
    return aux, z, first.aux_loss_coef * aux + first.z_loss_coef * z


def router_losses(model: nn.Module) -> RouterLosses | None:
    """The :class:`RouterLosses` of the last training forward pass of ``model``'s MoE blocks, or None
    without such blocks or outside training.

    Per stack over its real tokens: ``aux = E * sum_i f_i * P_i`` (``f_i`` the assignments to expert
    ``i`` over the tokens, summing to ``k``; ``P_i`` its mean router probability, per-token normalised
    affinities for sigmoid routing, DeepSeek-V3 eq. 19) and ``z = mean logsumexp(logits)^2``. An
    encoder-decoder adds its two stacks' (HF ``SwitchTransformersForConditionalGeneration``).

    Raises:
        ValueError: blocks of one stack with different sizes or coefficients.
    """
    blocks = moe_blocks(model)
    if not blocks or any(b.stats is None or b.stats.prob_sum is None for b in blocks):
        return None
    stacks = [s for s in model.modules() if isinstance(s, TransformerStack)]
    groups = [g for g in (moe_blocks(s) for s in stacks) if g] or [blocks]
    aux, z, weighted = (torch.stack(t).sum() for t in zip(*(_stack_losses(g) for g in groups)))
    load = torch.stack([b.stats.load for b in blocks])
    return RouterLosses(
        aux_loss=aux, z_loss=z, weighted=weighted, load=load, dropped=sum(b.stats.dropped for b in blocks)
    )


def update_expert_biases(model: nn.Module, load: Tensor | Iterable[Tensor]) -> None:
    """:meth:`TopKRouter.update_bias` of every MoE block of ``model`` with its row of ``load``
    (``(n_moe_layers, E)``, in :func:`moe_blocks` order, as :attr:`RouterLosses.load`)."""
    for block, row in zip(moe_blocks(model), load):
        block.router.update_bias(row)
