"""The sizes a model config implies, computed in one place: head width, key/value heads, the
feed-forward hidden width and, for ``model/ffn=moe``, the experts' sizes. The builder, the
FLOPs/parameter counts, the exporters and the validation all read them from :func:`model_sizes`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformer.config.schema import ConfigError
from transformer.modules.attention import ATTENTION_KINDS
from transformer.modules.ffn import FFNS

__all__ = ["ModelSizes", "ffn_size", "head_dim", "model_sizes", "resolve_n_kv_heads"]


def head_dim(model: Any) -> int:
    """Width of one attention head: ``model.d_model // model.n_heads``."""
    return model.d_model // model.n_heads


def resolve_n_kv_heads(model: Any) -> int:
    """Number of key/value heads implied by ``model.attention`` and ``model.n_kv_heads``
    (:data:`~transformer.modules.attention.ATTENTION_KINDS`).

    Raises:
        ConfigError: when the two disagree (e.g. ``mha`` with ``n_kv_heads != n_heads``) or the
            attention kind is unknown.
    """
    rule = ATTENTION_KINDS.get(model.attention)
    if rule is None:
        raise ConfigError(f"model.attention={model.attention!r} is not one of {', '.join(ATTENTION_KINDS)}")
    try:
        return rule(model.n_heads, model.n_kv_heads)
    except ValueError as e:
        raise ConfigError(f"model/attention={model.attention} {e} (model.n_heads, model.n_kv_heads)") from None


@dataclass(frozen=True)
class ModelSizes:
    """Sizes derived from a model config.

    Attributes:
        d_model: model width.
        n_heads: query heads.
        head_dim: width of one head, ``d_model // n_heads``.
        n_kv_heads: key/value heads (see :func:`resolve_n_kv_heads`).
        ffn_hidden: hidden width of the feed-forward block (``d_ff``, or the parameter-matched GLU
            width for gated blocks with ``glu_match_params``); of one expert for ``model/ffn=moe``.
        ffn_matrices: ``d_model x ffn_hidden`` matrices of the feed-forward block (2, or 3 gated);
            of one expert for ``model/ffn=moe``.
        n_experts: routed experts per feed-forward block (0: a dense block).
        top_k: experts per token (0: a dense block).
        shared_hidden: hidden width of the shared-expert block, ``n_shared_experts * ffn_hidden`` (0: none).
    """

    d_model: int
    n_heads: int
    head_dim: int
    n_kv_heads: int
    ffn_hidden: int
    ffn_matrices: int
    n_experts: int = 0
    top_k: int = 0
    shared_hidden: int = 0

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): ``n_kv_heads * head_dim``."""
        return self.n_kv_heads * self.head_dim


def ffn_size(model: Any) -> tuple[int, int]:
    """``(hidden width, number of d_model x hidden matrices)`` of the feed-forward block named by
    ``model.ffn.name`` (:data:`~transformer.modules.ffn.FFNS`); for ``moe``, of one expert: the
    ``model.ffn.expert`` block at width ``model.ffn.expert_d_ff`` (null: ``model.d_ff``).

    Raises:
        ConfigError: when ``model.ffn.name`` (or, for ``moe``, ``model.ffn.expert``) is unknown.
    """
    choice = FFNS.get(model.ffn.name)
    if choice is None:
        raise ConfigError(f"model.ffn.name={model.ffn.name!r} is not one of {', '.join(FFNS)}")
    d_ff = model.d_ff
    if choice.routed:
        choice = FFNS.get(model.ffn.expert)
        if choice is None or choice.routed:
            dense = [name for name, c in FFNS.items() if not c.routed]
            raise ConfigError(f"model.ffn.expert={model.ffn.expert!r} is not one of {', '.join(dense)}")
        d_ff = model.d_ff if model.ffn.expert_d_ff is None else model.ffn.expert_d_ff
    return choice.block.hidden_size(d_ff, model.ffn.glu_match_params, model.ffn.multiple_of), choice.block.n_matrices


def model_sizes(model: Any) -> ModelSizes:
    """The :class:`ModelSizes` of ``model`` (a :class:`~transformer.config.ModelConfig` or DictConfig).

    Raises:
        ConfigError: when ``model.attention`` and ``model.n_kv_heads`` disagree or ``model.ffn.name``
            (``model.ffn.expert``) is unknown.
    """
    hidden, matrices = ffn_size(model)
    routed = FFNS[model.ffn.name].routed
    return ModelSizes(
        d_model=model.d_model,
        n_heads=model.n_heads,
        head_dim=head_dim(model),
        n_kv_heads=resolve_n_kv_heads(model),
        ffn_hidden=hidden,
        ffn_matrices=matrices,
        n_experts=model.ffn.n_experts if routed else 0,
        top_k=model.ffn.top_k if routed else 0,
        shared_hidden=model.ffn.n_shared_experts * hidden if routed else 0,
    )
