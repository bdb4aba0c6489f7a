"""The sizes a model config implies, computed in one place: head width, key/value heads, the
latent sizes of multi-head latent attention, the KV-cache width, the sliding window of each layer,
the feed-forward hidden width and, for ``model/ffn=moe``, the experts' sizes. The builder, the
FLOPs/parameter counts, the exporters and the validation all read them from :func:`model_sizes`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformer.config.schema import ConfigError
from transformer.modules.attention import ATTENTION_KINDS
from transformer.modules.ffn import FFNS
from transformer.modules.rope_scaling import RopeScaling

__all__ = [
    "LatentSizes",
    "ModelSizes",
    "ffn_size",
    "head_dim",
    "kv_cache_values",
    "latent_sizes",
    "layer_windows",
    "model_sizes",
    "resolve_n_kv_heads",
    "rope_scaling",
]


def head_dim(model: Any) -> int:
    """Width of one attention head: ``model.d_model // model.n_heads``."""
    return model.d_model // model.n_heads


def resolve_n_kv_heads(model: Any) -> int:
    """Number of key/value heads implied by ``model.attention.name`` and ``model.attention.n_kv_heads``
    (:data:`~transformer.modules.attention.ATTENTION_KINDS`).

    Raises:
        ConfigError: when the two disagree (e.g. ``mha`` with ``n_kv_heads != n_heads``) or the
            attention kind is unknown.
    """
    attention = model.attention
    rule = ATTENTION_KINDS.get(attention.name)
    if rule is None:
        raise ConfigError(f"model/attention={attention.name!r} is not one of {', '.join(ATTENTION_KINDS)}")
    try:
        return rule.kv_heads(model.n_heads, attention.n_kv_heads)
    except ValueError as e:
        raise ConfigError(f"model/attention={attention.name} {e} (model.n_heads, model.attention.n_kv_heads)") from None


@dataclass(frozen=True)
class LatentSizes:
    """The sizes of multi-head latent attention (DeepSeek-V2 §2.1; HF ``DeepseekV3Config`` names).

    Attributes:
        kv_lora_rank: width of the key/value latent ``c_KV``.
        q_lora_rank: width of the query latent, or None for a full query projection.
        qk_nope_head_dim: per-head query/key width without position.
        qk_rope_head_dim: per-head rotated query width = the shared rotated key's width.
        v_head_dim: per-head value width.
    """

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def latent_sizes(model: Any) -> LatentSizes | None:
    """The :class:`LatentSizes` of a ``model/attention=mla`` config (None for other kinds).

    Null fields follow DeepSeek-V2's proportions of ``head_dim = d_model // n_heads``:
    ``kv_lora_rank = 4 * head_dim``, ``qk_nope_head_dim = v_head_dim = head_dim``, ``qk_rope_head_dim =
    head_dim / 2`` rounded down to even with RoPE (0 without). The cache then holds 4.5 head widths per
    token and layer (§2.1.4)."""
    attention = model.attention
    if not ATTENTION_KINDS[attention.name].latent:
        return None
    hd = head_dim(model)

    def pick(name: str, default: int) -> int:
        value = getattr(attention, name, None)
        return default if value is None else int(value)

    rope = pick("qk_rope_head_dim", hd // 4 * 2 if model.position.name == "rope" else 0)
    q_lora = getattr(attention, "q_lora_rank", None)
    return LatentSizes(
        kv_lora_rank=pick("kv_lora_rank", 4 * hd),
        q_lora_rank=None if q_lora is None else int(q_lora),
        qk_nope_head_dim=pick("qk_nope_head_dim", hd),
        qk_rope_head_dim=rope,
        v_head_dim=pick("v_head_dim", hd),
    )


def layer_windows(model: Any, n_layers: int) -> list[int | None]:
    """The sliding window of each of ``n_layers`` layers of a stack (None = global).

    ``model.attention_window=W`` makes every layer local (Mistral), except, with
    ``model.attention_window_pattern=N``, every N-th (layers N-1, 2N-1, ...: Gemma 2 with N=2,
    Gemma 3 with N=6, HF's ``sliding_window_pattern``).
    """
    window = getattr(model, "attention_window", None)  # configs written before the field: global
    every = getattr(model, "attention_window_pattern", 0) or 0
    if window is None:
        return [None] * n_layers
    return [None if every and (i + 1) % every == 0 else int(window) for i in range(n_layers)]


def kv_cache_values(model: Any) -> int:
    """Values one self-attention layer caches per token, from the attention fields only (so an older
    run's partial record still gives it)."""
    latent = latent_sizes(model)
    if latent is not None:
        return latent.kv_lora_rank + latent.qk_rope_head_dim
    kind = ATTENTION_KINDS[model.attention.name]
    if not kind.builtin:
        if kind.cache_values is None:
            raise ConfigError(
                f"model/attention={model.attention.name}: its plugin does not say what it caches "
                "(register_attention(cache_values=...)); the KV-cache size is unknown"
            )
        return int(kind.cache_values(model.n_heads, resolve_n_kv_heads(model), head_dim(model), model.attention))
    return 2 * resolve_n_kv_heads(model) * head_dim(model)


def rope_scaling(model: Any) -> RopeScaling | None:
    """The :class:`~transformer.modules.rope_scaling.RopeScaling` of ``model.position.rope_scaling`` (None
    for ``default``); ``dynamic`` without ``original_max_position_embeddings`` takes
    ``model.max_positions``; its ``config`` is the node (a plugin's own fields)."""
    rs = getattr(model.position, "rope_scaling", None)
    if rs is None or rs.rope_type == "default":
        return None
    original = rs.original_max_position_embeddings
    if original is None and rs.rope_type == "dynamic":
        original = model.max_positions
    return RopeScaling(
        rope_type=str(rs.rope_type),
        factor=float(rs.factor),
        original_max_position_embeddings=None if original is None else int(original),
        low_freq_factor=float(rs.low_freq_factor),
        high_freq_factor=float(rs.high_freq_factor),
        beta_fast=float(rs.beta_fast),
        beta_slow=float(rs.beta_slow),
        attention_factor=None if rs.attention_factor is None else float(rs.attention_factor),
        config=rs,
    )


@dataclass(frozen=True)
class ModelSizes:
    """Sizes derived from a model config.

    Attributes:
        head_dim: ``d_model // n_heads``.
        ffn_hidden: the feed-forward hidden width (``d_ff``, or the parameter-matched GLU width); of
            one expert for ``model/ffn=moe``.
        ffn_matrices: ``d_model x ffn_hidden`` matrices (2, or 3 gated); of one expert for moe.
        latent: the MLA sizes, or None.
        n_experts, top_k: routed experts per block and per token (0: dense).
        shared_hidden: ``n_shared_experts * ffn_hidden`` (0: none).
    """

    d_model: int
    n_heads: int
    head_dim: int
    n_kv_heads: int
    ffn_hidden: int
    ffn_matrices: int
    latent: LatentSizes | None = None
    n_experts: int = 0
    top_k: int = 0
    shared_hidden: int = 0

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): ``n_kv_heads * head_dim``."""
        return self.n_kv_heads * self.head_dim

    @property
    def kv_cache_values(self) -> int:
        """Values one self-attention layer caches per token: ``2 * n_kv_heads * head_dim`` (K and
        V), or ``kv_lora_rank + qk_rope_head_dim`` for MLA (the latent and the shared RoPE key)."""
        if self.latent is not None:
            return self.latent.kv_lora_rank + self.latent.qk_rope_head_dim
        return 2 * self.kv_width

    @property
    def rotary_dim(self) -> int:
        """The per-head width RoPE rotates: ``head_dim``, or MLA's ``qk_rope_head_dim``."""
        return self.latent.qk_rope_head_dim if self.latent is not None else self.head_dim


def ffn_size(model: Any) -> tuple[int, int]:
    """``(hidden width, d_model x hidden matrices)`` of ``model.ffn.name``; for ``moe``, of one expert
    (``model.ffn.expert`` at ``model.ffn.expert_d_ff``, null: ``model.d_ff``).

    Raises:
        ConfigError: an unknown ``model.ffn.name`` (or ``model.ffn.expert``).
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
    """The :class:`ModelSizes` of ``model``.

    Raises:
        ConfigError: ``model.attention`` name and ``n_kv_heads`` disagree, or an unknown feed-forward block.
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
        latent=latent_sizes(model),
        n_experts=model.ffn.n_experts if routed else 0,
        top_k=model.ffn.top_k if routed else 0,
        shared_hidden=model.ffn.n_shared_experts * hidden if routed else 0,
    )
