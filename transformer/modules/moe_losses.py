"""The router losses of a model's mixture-of-experts blocks, collected after a forward pass, and
DeepSeek-V3's bias update (:mod:`transformer.modules.moe` holds the blocks).

* :func:`router_losses`: the load-balancing loss of Switch Transformer (Fedus et al. 2021, eq. 4)
  exactly as Hugging Face's ``load_balancing_loss_func`` computes it with an ``attention_mask``
  (``n_experts * sum_i f_i * P_i`` over the real tokens of all MoE layers of a stack at once,
  padding left out) and the router z-loss of ST-MoE (Zoph et al. 2022, eq. 5) over the same
  tokens, per stack, summed over the stacks.
* :func:`update_expert_biases`: DeepSeek-AI 2024 (DeepSeek-V3), §2.1.2, after each update.
"""

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
    """The router losses of a model's last training forward pass (:func:`router_losses`).

    Attributes:
        aux_loss: ``()`` the load-balancing loss, summed over the stacks (unweighted).
        z_loss: ``()`` the router z-loss, summed over the stacks (unweighted).
        weighted: ``()`` ``aux_loss_coef * aux_loss + z_loss_coef * z_loss``, what the training
            loss adds per target token.
        load: ``(n_moe_layers, E)`` int64 assignments of real tokens per expert of each block
            (detached), in :func:`moe_blocks` order.
        dropped: assignments no expert processed, all blocks (0).
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
    """Collect the router losses of the last *training* forward pass of ``model``'s MoE blocks.

    Per stack (the encoder, the decoder), over all its MoE layers' real tokens together, as
    Hugging Face's ``load_balancing_loss_func`` does for the tuple of a model's router logits and
    its ``attention_mask``: ``aux = E * sum_i f_i * P_i`` (Switch Transformer eq. 4 with ``alpha``
    left out; ``f_i`` the assignments to expert ``i`` over the number of real tokens, so that with
    top-k routing the ``f_i`` sum to ``k`` and a balanced router scores ``k``; ``P_i`` its mean
    router probability) and ``z = mean_real_tokens logsumexp(logits)^2`` (ST-MoE eq. 5). Padding
    positions (the blocks' ``token_mask``) count in neither.
    An encoder-decoder adds its two stacks' losses (HF ``SwitchTransformersForConditionalGeneration``).
    For ``sigmoid`` routing ``P_i`` averages the affinities normalised per token (DeepSeek-V3 eq. 19).
    A bare block outside any stack counts as one stack.

    Args:
        model: a model (or a block) whose forward pass ran in training mode.

    Returns:
        The :class:`RouterLosses`, or None when ``model`` has no MoE block or its last forward pass
        was not in training mode.

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
