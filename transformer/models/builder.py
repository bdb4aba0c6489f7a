"""The builder: a :class:`~transformer.config.ModelConfig` into modules. Component builders wire one
part from sizes (:func:`~transformer.config.model_sizes`), its class taken from the switch's table
beside the classes; :func:`build_model` wires a whole model. Modules never see the config."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any

import torch
from torch import nn

from transformer.config import (
    LatentSizes,
    layer_windows,
    model_sizes,
    option_config,
    rope_scaling,
    validate_model_config,
)
from transformer.models.decoder_only import DecoderOnlyModel
from transformer.models.encoder_decoder import EncoderDecoderModel
from transformer.modules.attention import ATTENTION_KINDS, Attention
from transformer.modules.embedding import TokenEmbedding
from transformer.modules.ffn import FFNS
from transformer.modules.layers import TransformerLayer, TransformerStack
from transformer.modules.mla import MultiHeadLatentAttention
from transformer.modules.moe import GroupedExperts, MixtureOfExperts
from transformer.modules.moe_router import ROUTER_SCORES, TopKRouter
from transformer.modules.norms import NORMS
from transformer.modules.positions import POSITIONS, PositionEncoding
from transformer.modules.residual import RESIDUALS
from transformer.modules.rope_scaling import RopeScaling

__all__ = [
    "build_attention",
    "build_ffn",
    "build_mla",
    "build_model",
    "build_moe",
    "build_norm",
    "build_position",
    "qk_norm_config",
]


def _pick(table: dict[str, Any], name: str, switch: str) -> Any:
    if name not in table:
        raise ValueError(f"{switch}={name!r} is not one of {', '.join(table)}")
    return table[name]


def _call_with_config(factory: Any, config: Any, **kwargs: Any) -> Any:
    """``factory(**kwargs)``, plus ``config=`` (the group's node: a plugin option's own fields) when the
    factory takes it (:mod:`transformer.registry`'s contracts; the built-in classes do not)."""
    if config is not None and "config" in inspect.signature(factory).parameters:
        kwargs["config"] = config
    return factory(**kwargs)


def _option_defaults(switch: str, name: str) -> Any:
    """The default fields of option ``name`` of group ``switch`` (its own dataclass, or the group's with
    the option named): what an option built where the config holds no node of its own receives."""
    return option_config(switch, name)(name=name)


def build_norm(name: str, width: int, eps: float, config: Any = None) -> nn.Module:
    """The ``model/norm`` norm over ``width``: built by a plugin class's ``from_sizes(*, width, eps[,
    config])``, else ``cls(width, eps=eps)``."""
    cls = _pick(NORMS, name, "model/norm")
    if callable(getattr(cls, "from_sizes", None)):
        return _call_with_config(cls.from_sizes, config, width=width, eps=eps)
    return cls(width, eps=eps)


def qk_norm_config(cfg: Any) -> Any:
    """The fields the ``model.qk_norm`` norm is built with: the ``model.norm`` node when it names the
    same option (its fields shared), else that option's defaults with ``model.norm.eps``
    (``model.qk_norm`` is a name, without a node of its own). None for ``model.qk_norm=none``."""
    if cfg.qk_norm == "none":
        return None
    if cfg.qk_norm == cfg.norm.name:
        return cfg.norm
    fields = _option_defaults("model/norm", cfg.qk_norm)
    fields.eps = cfg.norm.eps
    return fields


def build_ffn(
    name: str,
    d_model: int,
    d_ff: int,
    bias: bool,
    dropout: float,
    glu_match_params: bool,
    multiple_of: int,
    config: Any = None,
) -> nn.Module:
    """The ``model/ffn`` block, its hidden width the block's ``hidden_size(d_ff, glu_match_params,
    multiple_of)``; ``config`` reaches a plugin's ``from_sizes``."""
    choice = _pick(FFNS, name, "model/ffn")
    hidden = choice.block.hidden_size(d_ff, glu_match_params, multiple_of)
    return _call_with_config(
        choice.block.from_sizes,
        config,
        d_model=d_model,
        hidden=hidden,
        activation=choice.activation,
        bias=bias,
        dropout=dropout,
    )


def build_moe(cfg: Any) -> MixtureOfExperts:
    """The ``model/ffn=moe`` mixture of experts: a :class:`TopKRouter` over ``n_experts`` experts, each a
    ``model.ffn.expert`` block, plus one shared block ``n_shared_experts`` experts wide when > 0."""
    f, sizes = cfg.ffn, model_sizes(cfg)
    expert = _pick(FFNS, f.expert, "model.ffn.expert")
    router = TopKRouter(
        gate=nn.Linear(cfg.d_model, sizes.n_experts, bias=False),
        scoring=_pick(ROUTER_SCORES, f.router, "model.ffn.router"),
        top_k=sizes.top_k,
        norm_topk_prob=f.norm_topk_prob,
        routed_scaling_factor=f.routed_scaling_factor,
        bias_update_speed=f.bias_update_speed,
    )
    experts = GroupedExperts(
        n_experts=sizes.n_experts,
        d_model=cfg.d_model,
        hidden=sizes.ffn_hidden,
        activation=expert.activation,
        gated=expert.gated,
        bias=cfg.bias,
        dropout=cfg.activation_dropout,
    )
    shared = None
    if sizes.shared_hidden:  # a plugin block with fields of its own gets its defaults (model.ffn is the MoE's node)
        shared = _call_with_config(
            expert.block.from_sizes,
            _option_defaults("model/ffn", f.expert),
            d_model=cfg.d_model,
            hidden=sizes.shared_hidden,
            activation=expert.activation,
            bias=cfg.bias,
            dropout=cfg.activation_dropout,
        )
    return MixtureOfExperts(
        router=router,
        experts=experts,
        shared_experts=shared,
        aux_loss_coef=f.router_aux_loss_coef,
        z_loss_coef=f.router_z_loss_coef,
    )


def build_attention(
    d_model: int,
    n_heads: int,
    n_kv_heads: int,
    bias: bool,
    dropout: float,
    qk_norm: str = "none",
    eps: float = 1e-5,
    qk_norm_fields: Any = None,
) -> Attention:
    """An :class:`Attention` with packed q/k/v projections of ``d_model // n_heads`` wide heads; ``qk_norm``
    (``none`` or a norm option) adds a norm over ``head_dim`` on every query and key head."""
    head_dim = d_model // n_heads
    in_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias)
    out_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias)
    norms = (
        {}
        if qk_norm == "none"
        else {
            "q_norm": build_norm(qk_norm, head_dim, eps, qk_norm_fields),
            "k_norm": build_norm(qk_norm, head_dim, eps, qk_norm_fields),
        }
    )
    return Attention(
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        in_proj=in_proj,
        out_proj=out_proj,
        dropout=dropout,
        **norms,
    )


def build_mla(
    d_model: int, n_heads: int, latent: LatentSizes, bias: bool, dropout: float, eps: float
) -> MultiHeadLatentAttention:
    """A :class:`MultiHeadLatentAttention` laid out as HF ``DeepseekV3Attention``: ``bias`` on the
    projections from or to ``d_model`` only (HF's ``attention_bias``), RMSNorm latents."""
    qk = n_heads * latent.qk_head_dim
    if latent.q_lora_rank is None:
        q_proj: nn.Module = nn.Linear(d_model, qk, bias=False)
    else:
        q_proj = nn.Sequential(
            nn.Linear(d_model, latent.q_lora_rank, bias=bias),
            build_norm("rmsnorm", latent.q_lora_rank, eps),
            nn.Linear(latent.q_lora_rank, qk, bias=False),
        )
    return MultiHeadLatentAttention(
        n_heads=n_heads,
        kv_lora_rank=latent.kv_lora_rank,
        qk_nope_head_dim=latent.qk_nope_head_dim,
        qk_rope_head_dim=latent.qk_rope_head_dim,
        v_head_dim=latent.v_head_dim,
        q_proj=q_proj,
        kv_down=nn.Linear(d_model, latent.kv_lora_rank + latent.qk_rope_head_dim, bias=bias),
        kv_norm=build_norm("rmsnorm", latent.kv_lora_rank, eps),
        kv_up=nn.Linear(latent.kv_lora_rank, n_heads * (latent.qk_nope_head_dim + latent.v_head_dim), bias=False),
        out_proj=nn.Linear(n_heads * latent.v_head_dim, d_model, bias=bias),
        dropout=dropout,
    )


def build_position(
    name: str,
    d_model: int,
    n_heads: int,
    max_positions: int,
    rope_theta: float,
    rotary_dim: int | None = None,
    scaling: RopeScaling | None = None,
    config: Any = None,
) -> PositionEncoding:
    """The ``model/position`` encoding; ``rotary_dim`` defaults to ``d_model // n_heads`` (MLA:
    ``qk_rope_head_dim``)."""
    cls = _pick(POSITIONS, name, "model/position")
    return _call_with_config(
        cls.from_sizes,
        config,
        d_model=d_model,
        n_heads=n_heads,
        max_positions=max_positions,
        rope_theta=rope_theta,
        rotary_dim=rotary_dim,
        rope_scaling=scaling,
    )


def _build_stack(cfg: Any, n_layers: int, n_kv_heads: int, cross: bool) -> TransformerStack:
    residual = _pick(RESIDUALS, cfg.norm_position, "model.norm_position")

    qk_fields = qk_norm_config(cfg)

    def block(sublayer: nn.Module) -> nn.Module:
        return residual(
            sublayer=sublayer, norm=build_norm(cfg.norm.name, cfg.d_model, cfg.norm.eps, cfg.norm), dropout=cfg.dropout
        )

    def attention() -> Attention:
        return build_attention(
            cfg.d_model, cfg.n_heads, n_kv_heads, cfg.bias, cfg.attention_dropout, cfg.qk_norm, cfg.norm.eps, qk_fields
        )

    def self_attention() -> nn.Module:
        kind = ATTENTION_KINDS[cfg.attention.name]
        if kind.latent:  # MLA: self-attention only; cross-attention stays MHA
            return build_mla(
                cfg.d_model, cfg.n_heads, model_sizes(cfg).latent, cfg.bias, cfg.attention_dropout, cfg.norm.eps
            )
        if not kind.builtin:  # a plugin's class (transformer.registry.register_attention's contract)
            qk_norm = (
                None
                if cfg.qk_norm == "none"
                else functools.partial(build_norm, cfg.qk_norm, eps=cfg.norm.eps, config=qk_fields)
            )
            return kind.self_attention.from_sizes(
                d_model=cfg.d_model,
                n_heads=cfg.n_heads,
                n_kv_heads=n_kv_heads,
                head_dim=cfg.d_model // cfg.n_heads,
                bias=cfg.bias,
                dropout=cfg.attention_dropout,
                qk_norm=qk_norm,
                config=cfg.attention,
            )
        return attention()

    def ffn() -> nn.Module:
        if _pick(FFNS, cfg.ffn.name, "model/ffn").routed:
            return build_moe(cfg)
        return build_ffn(
            cfg.ffn.name,
            cfg.d_model,
            cfg.d_ff,
            cfg.bias,
            cfg.activation_dropout,
            cfg.ffn.glu_match_params,
            cfg.ffn.multiple_of,
            cfg.ffn,
        )

    layers = [
        TransformerLayer(
            self_attn=block(self_attention()),
            ffn=block(ffn()),
            cross_attn=block(attention()) if cross else None,
            window=window,
        )
        for window in layer_windows(cfg, n_layers)
    ]
    final = build_norm(cfg.norm.name, cfg.d_model, cfg.norm.eps, cfg.norm) if residual.final_norm else None
    return TransformerStack(layers=layers, final_norm=final)


def _init_weights(model: nn.Module, cfg: Any, embeddings: list[nn.Embedding], pad_id: int) -> None:
    """``xavier``: fairseq's transformer init (Xavier-uniform linears, zero biases, N(0, d^-1/2)
    embeddings); ``normal``: Llama/GPT style N(0, init_std) for every matrix. The stacked matrices of
    :class:`GroupedExperts` get the same init, one expert's matrix at a time."""

    def init_matrix(weight: torch.Tensor) -> None:
        if cfg.init == "xavier":
            nn.init.xavier_uniform_(weight)
        else:
            nn.init.normal_(weight, std=cfg.init_std)

    for module in model.modules():
        if isinstance(module, nn.Linear):
            init_matrix(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, GroupedExperts):
            module.reset_parameters(init_matrix)
    for emb in embeddings:  # after the linears: a tied output projection takes the embedding init
        nn.init.normal_(emb.weight, std=cfg.d_model**-0.5 if cfg.init == "xavier" else cfg.init_std)
        emb.weight.data[pad_id].zero_()


def build_model(
    cfg: Any,
    src_vocab_size: int,
    tgt_vocab_size: int | None = None,
    *,
    pad_id: int = 0,
    bos_id: int = 2,
    eos_id: int = 3,
    sep_id: int = 4,
) -> EncoderDecoderModel | DecoderOnlyModel:
    """Build the model described by ``cfg`` (a :class:`~transformer.config.ModelConfig` or DictConfig).

    Args:
        cfg: the model config; validated first.
        src_vocab_size: source vocabulary (the only one for a joint vocabulary / decoder-only).
        tgt_vocab_size: target vocabulary; None means the same as the source (joint vocabulary).
        pad_id, bos_id, eos_id, sep_id: special token ids of the tokenizer.

    Returns:
        :class:`EncoderDecoderModel` or :class:`DecoderOnlyModel`.

    Raises:
        ConfigError: for invalid field combinations (see :func:`validate_model_config`).
    """
    joint = tgt_vocab_size is None or tgt_vocab_size == src_vocab_size
    validate_model_config(cfg, joint_vocab=tgt_vocab_size is None)
    tgt_vocab_size = src_vocab_size if tgt_vocab_size is None else tgt_vocab_size
    sizes = model_sizes(cfg)
    n_kv_heads = sizes.n_kv_heads
    d = cfg.d_model
    scale = math.sqrt(d) if cfg.scale_embeddings else 1.0

    def position() -> PositionEncoding:
        return build_position(
            cfg.position.name,
            d,
            cfg.n_heads,
            cfg.max_positions,
            cfg.position.rope_theta,
            sizes.rotary_dim,
            rope_scaling(cfg),
            cfg.position,
        )

    if cfg.arch == "decoder_only":
        emb = nn.Embedding(src_vocab_size, d, padding_idx=pad_id)
        out = nn.Linear(d, src_vocab_size, bias=False)
        stack = _build_stack(cfg, cfg.n_encoder_layers + cfg.n_decoder_layers, n_kv_heads, cross=False)
        model = DecoderOnlyModel(
            embed=TokenEmbedding(embedding=emb, position=position(), scale=scale, dropout=cfg.dropout),
            decoder=stack,
            output_proj=out,
            n_heads=cfg.n_heads,
            pad_id=pad_id,
            sep_id=sep_id,
            eos_id=eos_id,
        )
        embeddings = [emb]
        if cfg.tie_embeddings != "none":
            out.weight = emb.weight
        elif cfg.init == "xavier":
            embeddings.append(out)  # fairseq inits an untied output matrix like an embedding
    else:
        src_emb = nn.Embedding(src_vocab_size, d, padding_idx=pad_id)
        tgt_emb = (
            src_emb if cfg.tie_embeddings == "all" and joint else nn.Embedding(tgt_vocab_size, d, padding_idx=pad_id)
        )
        out = nn.Linear(d, tgt_vocab_size, bias=False)
        model = EncoderDecoderModel(
            src_embed=TokenEmbedding(embedding=src_emb, position=position(), scale=scale, dropout=cfg.dropout),
            tgt_embed=TokenEmbedding(embedding=tgt_emb, position=position(), scale=scale, dropout=cfg.dropout),
            encoder=_build_stack(cfg, cfg.n_encoder_layers, n_kv_heads, cross=False),
            decoder=_build_stack(cfg, cfg.n_decoder_layers, n_kv_heads, cross=True),
            output_proj=out,
            n_heads=cfg.n_heads,
            pad_id=pad_id,
            bos_id=bos_id,
            eos_id=eos_id,
        )
        embeddings = [src_emb] if tgt_emb is src_emb else [src_emb, tgt_emb]
        if cfg.tie_embeddings in ("decoder", "all"):
            out.weight = tgt_emb.weight
        elif cfg.init == "xavier":
            embeddings.append(out)
    _init_weights(model, cfg, embeddings, pad_id)
    return model
