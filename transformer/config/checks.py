"""Validation of configuration *combinations*: every invalid combination of fields is rejected
before anything is built, with a sentence that names the fields (:class:`ConfigError`)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer.config.fields import check_known_fields
from transformer.config.options import GROUPS, LR_SCHEDULERS, structured_config
from transformer.config.runtime import resume_mode, time_budget
from transformer.config.schema import ConfigError
from transformer.config.sizes import model_sizes
from transformer.modules.attention import ATTENTION_KINDS
from transformer.modules.ffn import FFNS
from transformer.modules.moe_router import ROUTER_SCORES
from transformer.modules.norms import NORMS
from transformer.modules.positions import POSITIONS
from transformer.modules.residual import RESIDUALS
from transformer.modules.rope_scaling import ROPE_SCALINGS

__all__ = [
    "check_checkpoint_averaging",
    "signal_number",
    "validate_config",
    "validate_generation_config",
    "validate_model_config",
    "validate_moe_config",
    "validate_optim_config",
    "validate_option_fields",
]


# the options of each switch: the tables beside the classes they name (read at each check: plugins add
# to them, transformer/registry.py), or fixed lists where the option selects a branch of the builder
_CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {
    "model.arch": lambda: ("encoder_decoder", "decoder_only"),
    "model.norm_position": lambda: tuple(RESIDUALS),
    "model.attention.name": lambda: tuple(ATTENTION_KINDS),
    "model.tie_embeddings": lambda: ("none", "decoder", "all"),
    "model.init": lambda: ("xavier", "normal"),
    "model.norm.name": lambda: tuple(NORMS),
    "model.ffn.name": lambda: tuple(FFNS),
    "model.position.name": lambda: tuple(POSITIONS),
    "model.qk_norm": lambda: ("none", *NORMS),
    "model.position.rope_scaling.rope_type": lambda: tuple(ROPE_SCALINGS),
}


_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def signal_number(name: str) -> signal.Signals:
    """The signal named ``name`` in ``train.stop_signals`` (``SIGTERM``, ``TERM``, ``term`` or ``15``).

    Raises:
        ConfigError: not a signal of this platform, or one that cannot be caught (SIGKILL, SIGSTOP);
            the message names the field.
    """
    text = str(name).strip().upper()
    try:
        sig = (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
        )
    except (KeyError, ValueError):
        raise ConfigError(f"train.stop_signals: {name!r} is not a signal name (e.g. SIGTERM, SIGUSR1)") from None
    if sig.name in _UNCATCHABLE:
        raise ConfigError(f"train.stop_signals: {sig.name} cannot be caught by a process; use SIGTERM or SIGUSR1")
    return sig


def _get(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def validate_model_config(model: Any, joint_vocab: bool = True) -> None:
    """Reject invalid model field combinations before anything is built (``joint_vocab``:
    ``data.joint_vocab``).

    Raises:
        ConfigError: naming the offending fields.
    """
    for key, options in _CHOICES.items():
        choices = options()
        value = _get({"model": model}, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")
    if model.d_model <= 0 or model.n_heads <= 0 or model.d_ff <= 0:
        raise ConfigError("model.d_model, model.n_heads and model.d_ff must be positive")
    if model.d_model % model.n_heads != 0:
        raise ConfigError(f"model.d_model={model.d_model} is not divisible by model.n_heads={model.n_heads}")
    sizes = model_sizes(model)
    n_kv, head_dim = sizes.n_kv_heads, sizes.head_dim
    if n_kv <= 0 or model.n_heads % n_kv != 0:
        raise ConfigError(f"model.n_heads={model.n_heads} is not divisible by model.attention.n_kv_heads={n_kv}")
    _validate_attention_options(model, sizes)
    if model.position.name == "rope" and sizes.latent is None and head_dim % 2 != 0:
        raise ConfigError(
            f"model/position=rope needs an even head dimension, but model.d_model / model.n_heads "
            f"= {model.d_model} / {model.n_heads} = {head_dim} is odd"
        )
    if model.tie_embeddings == "all" and not joint_vocab and model.arch == "encoder_decoder":
        raise ConfigError(
            "model.tie_embeddings=all shares the source and target embeddings and needs one "
            "vocabulary, but data.joint_vocab=false; use model.tie_embeddings=decoder or none"
        )
    if model.arch == "decoder_only" and not joint_vocab:
        raise ConfigError(
            "model.arch=decoder_only reads source and target in one sequence and needs data.joint_vocab=true"
        )
    if model.n_encoder_layers < 0 or model.n_decoder_layers < 0:
        raise ConfigError("model.n_encoder_layers and model.n_decoder_layers must be >= 0")
    if model.arch == "encoder_decoder" and (model.n_encoder_layers == 0 or model.n_decoder_layers == 0):
        raise ConfigError("model.arch=encoder_decoder needs model.n_encoder_layers > 0 and model.n_decoder_layers > 0")
    if model.arch == "decoder_only" and model.n_encoder_layers + model.n_decoder_layers == 0:
        raise ConfigError("model.arch=decoder_only needs model.n_encoder_layers + model.n_decoder_layers > 0")
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        p = getattr(model, name)
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"model.{name}={p} must be in [0, 1)")
    if FFNS[model.ffn.name].routed:
        validate_moe_config(model.ffn)
    validate_option_fields(model)


def _chosen_options(root: dict[str, Any], prefix: str = "") -> Any:
    """``(switch, option name, node, option dataclass)`` of each group of :data:`GROUPS` under
    ``prefix`` that ``root`` (``{"model": ..., "lr_scheduler": ...}``) holds a node of."""
    for switch, group in GROUPS.items():
        if not group.path.startswith(prefix) or group.path.split(".")[0] not in root:
            continue
        try:
            node = _get(root, group.path)
        except (AttributeError, KeyError):
            continue
        if node is None:
            continue
        name = node[group.key] if isinstance(node, (dict, DictConfig)) else getattr(node, group.key)
        yield switch, name, node, group.options.get(name)


def _run_check(switch: str, name: str, check: Callable[..., Any], *args: Any) -> None:
    try:
        check(*args)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{switch}={name}: " + " ".join(str(err).split())) from None


def validate_option_fields(model: Any, cfg: Any = None) -> None:
    """Run each chosen option's own checks after the built-in rules: its config dataclass's
    ``validate(self)`` and, with the whole ``cfg``, ``validate_config(self, cfg)`` (``cfg`` None: the
    model's groups and ``validate`` only).

    Raises:
        ConfigError: ``<group>=<option>: <the option's message>``.
    """
    root = {"model": model}
    if cfg is not None:
        root.update({top: _get(cfg, top) for top in {g.path.split(".")[0] for g in GROUPS.values()} - {"model"}})
    for switch, name, node, option in _chosen_options(root, "model." if cfg is None else ""):
        check = getattr(option, "validate", None)
        if callable(check) and (cfg is None or not switch.startswith("model/")):  # the model's ran with the model's
            _run_check(switch, name, check, node)
        whole = getattr(option, "validate_config", None)
        if cfg is not None and callable(whole):
            _run_check(switch, name, whole, node, cfg)


def validate_moe_config(ffn: Any) -> None:
    """Reject invalid ``model/ffn=moe`` settings (``model.ffn.expert`` is checked by
    :func:`~transformer.config.sizes.model_sizes`).

    Raises:
        ConfigError: naming the offending ``model.ffn.*`` fields.
    """
    if ffn.router not in ROUTER_SCORES:
        raise ConfigError(f"model.ffn.router={ffn.router!r} is not one of {', '.join(ROUTER_SCORES)}")
    if ffn.n_experts < 1 or ffn.top_k < 1:
        raise ConfigError(f"model.ffn.n_experts={ffn.n_experts} and model.ffn.top_k={ffn.top_k} must be >= 1")
    if ffn.top_k > ffn.n_experts:
        raise ConfigError(
            f"model.ffn.top_k={ffn.top_k} is more than model.ffn.n_experts={ffn.n_experts}: each token "
            "goes to top_k different experts"
        )
    if ffn.top_k == 1 and ffn.norm_topk_prob:
        raise ConfigError(
            "model.ffn.top_k=1 with model.ffn.norm_topk_prob=true gives every token the weight 1, so the "
            "router would learn from its auxiliary losses only; set model.ffn.norm_topk_prob=false "
            "(Switch Transformer: the chosen expert's probability is its weight)"
        )
    if ffn.n_shared_experts < 0 or (ffn.expert_d_ff is not None and ffn.expert_d_ff <= 0):
        raise ConfigError(
            f"model.ffn.n_shared_experts={ffn.n_shared_experts} must be >= 0 and model.ffn.expert_d_ff="
            f"{ffn.expert_d_ff} positive (or null for model.d_ff)"
        )
    if not ffn.routed_scaling_factor > 0:
        raise ConfigError(f"model.ffn.routed_scaling_factor={ffn.routed_scaling_factor} must be > 0")
    for name in ("router_aux_loss_coef", "router_z_loss_coef", "bias_update_speed"):
        if getattr(ffn, name) < 0:
            raise ConfigError(f"model.ffn.{name}={getattr(ffn, name)} must be >= 0 (0 turns it off)")


def _validate_attention_options(model: Any, sizes: Any) -> None:
    """MLA sizes, QK-norm, the sliding window and RoPE scaling: their fields' combinations."""
    latent = sizes.latent
    if latent is not None:
        a = "model.attention"
        fields = (
            f"{a}.kv_lora_rank={latent.kv_lora_rank}, {a}.qk_nope_head_dim={latent.qk_nope_head_dim}, "
            f"{a}.qk_rope_head_dim={latent.qk_rope_head_dim}, {a}.v_head_dim={latent.v_head_dim}"
        )
        if latent.kv_lora_rank <= 0 or latent.v_head_dim <= 0 or latent.qk_nope_head_dim < 0:
            raise ConfigError(
                f"model/attention=mla needs {a}.kv_lora_rank > 0, {a}.v_head_dim > 0 and "
                f"{a}.qk_nope_head_dim >= 0, got {fields}"
            )
        if latent.q_lora_rank is not None and latent.q_lora_rank <= 0:
            raise ConfigError(f"{a}.q_lora_rank={latent.q_lora_rank} must be > 0 (or null: no query compression)")
        if model.position.name == "rope" and (latent.qk_rope_head_dim <= 0 or latent.qk_rope_head_dim % 2):
            raise ConfigError(
                f"model/attention=mla with model/position=rope needs {a}.qk_rope_head_dim even and > 0 "
                f"(the decoupled RoPE key, DeepSeek-V2 §2.1.3), got {fields}"
            )
        if model.position.name != "rope" and latent.qk_rope_head_dim != 0:
            raise ConfigError(
                f"{a}.qk_rope_head_dim={latent.qk_rope_head_dim} is a rotated width but "
                f"model/position={model.position.name}: set {a}.qk_rope_head_dim=0 or use model/position=rope"
            )
        if latent.qk_head_dim <= 0:
            raise ConfigError(
                f"model/attention=mla needs {a}.qk_nope_head_dim + {a}.qk_rope_head_dim > 0, got {fields}"
            )
        if model.qk_norm != "none":
            raise ConfigError(
                f"model.qk_norm={model.qk_norm} with model/attention=mla: MLA normalises its latent "
                "(kv_a_layernorm) instead; use model.qk_norm=none"
            )
    window, every = model.attention_window, model.attention_window_pattern
    if window is not None and window < 1:
        raise ConfigError(f"model.attention_window={window} must be >= 1 (or null for global attention)")
    if every < 0 or every == 1:
        raise ConfigError(
            f"model.attention_window_pattern={every} must be 0 (every layer local) or >= 2 "
            "(every N-th layer global); 1 would make every layer global"
        )
    if every and window is None:
        raise ConfigError(
            f"model.attention_window_pattern={every} needs model.attention_window (the local layers' window)"
        )
    rs = model.position.rope_scaling
    if rs.rope_type != "default":
        where = f"model.position.rope_scaling.rope_type={rs.rope_type}"
        if model.position.name != "rope":
            raise ConfigError(f"{where} scales RoPE but model/position={model.position.name}; use model/position=rope")
        if not 1.0 <= rs.factor < float("inf"):
            raise ConfigError(f"{where} needs a finite model.position.rope_scaling.factor >= 1, got {rs.factor}")
        if rs.attention_factor is not None and not 0.0 < rs.attention_factor < float("inf"):
            raise ConfigError(
                f"{where} needs model.position.rope_scaling.attention_factor > 0 (or null), got {rs.attention_factor}"
            )
        if rs.rope_type in ("yarn", "llama3") and not (rs.original_max_position_embeddings or 0) > 0:
            raise ConfigError(
                f"{where} needs model.position.rope_scaling.original_max_position_embeddings (the trained length, > 0)"
            )
        if rs.original_max_position_embeddings is not None and rs.original_max_position_embeddings <= 0:
            raise ConfigError("model.position.rope_scaling.original_max_position_embeddings must be > 0")
        if rs.rope_type == "llama3" and not 0 < rs.low_freq_factor < rs.high_freq_factor:
            raise ConfigError(
                f"{where} needs 0 < model.position.rope_scaling.low_freq_factor < high_freq_factor, "
                f"got {rs.low_freq_factor} and {rs.high_freq_factor}"
            )
        if rs.rope_type == "yarn" and not 0 < rs.beta_slow < rs.beta_fast:
            raise ConfigError(
                f"{where} needs 0 < model.position.rope_scaling.beta_slow < beta_fast, got "
                f"{rs.beta_slow} and {rs.beta_fast}"
            )
        if rs.rope_type in ("ntk", "dynamic") and sizes.rotary_dim <= 2:
            raise ConfigError(
                f"{where} needs a rotated head width > 2 (its base exponent is d / (d - 2)), got {sizes.rotary_dim}"
            )


def validate_config(cfg: Any) -> None:
    """Validate a whole :class:`Config` (model, data, optimisation, generation) before any work.

    Raises:
        ConfigError: naming the offending fields.
    """
    if isinstance(cfg, DictConfig):  # a key appended with Hydra's "+" that no typed node has: refused by name
        check_known_fields(cfg)
        try:
            job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            OmegaConf.merge(structured_config(job), job)
        except OmegaConfBaseException as err:
            raise ConfigError(f"mistyped field: {err}".splitlines()[0]) from None
    validate_model_config(cfg.model, joint_vocab=cfg.data.joint_vocab)
    t = cfg.train
    if t.precision not in ("auto", "fp32", "bf16", "fp16"):
        raise ConfigError(f"train.precision={t.precision!r} is not one of auto, fp32, bf16, fp16")
    if t.distributed not in ("ddp", "fsdp"):
        raise ConfigError(f"train.distributed={t.distributed!r} is not one of ddp, fsdp")
    if t.compile not in ("auto", True, False):
        raise ConfigError(f"train.compile={t.compile!r} is not one of auto, true, false")
    if t.grad_reduce_dtype not in ("fp32", "bf16"):
        raise ConfigError(f"train.grad_reduce_dtype={t.grad_reduce_dtype!r} is not one of fp32, bf16")
    if t.bucket_cap_mb <= 0:
        raise ConfigError(f"train.bucket_cap_mb={t.bucket_cap_mb} must be positive")
    if t.distributed == "fsdp" and t.precision == "fp16":
        raise ConfigError(
            "train.distributed=fsdp does not support train.precision=fp16 (no sharded GradScaler here); use bf16 or fp32"
        )
    if t.distributed == "fsdp" and t.ema_decay > 0:
        raise ConfigError(
            "train.ema_decay > 0 with train.distributed=fsdp: the moving average is not sharded; use train.distributed=ddp"
        )
    if t.max_tokens <= 0:
        raise ConfigError(f"train.max_tokens={t.max_tokens} must be positive")
    if t.pad_to_multiple != "auto" and (
        isinstance(t.pad_to_multiple, bool) or not isinstance(t.pad_to_multiple, int) or t.pad_to_multiple < 1
    ):
        raise ConfigError(
            f"train.pad_to_multiple={t.pad_to_multiple!r} must be auto or an integer >= 1 (1 = no rounding)"
        )
    if t.pad_to_multiple != "auto" and t.pad_to_multiple > min(t.max_tokens, cfg.model.max_positions):
        raise ConfigError(
            f"train.pad_to_multiple={t.pad_to_multiple} rounds every length past train.max_tokens={t.max_tokens} "
            f"or model.max_positions={cfg.model.max_positions}: a batch could not hold one sentence; use a multiple "
            "of at most both (e.g. 8)"
        )
    if t.update_freq < 1:
        raise ConfigError(f"train.update_freq={t.update_freq} must be >= 1")
    if t.prefetch != "auto" and (isinstance(t.prefetch, bool) or not isinstance(t.prefetch, int) or t.prefetch < 0):
        raise ConfigError(
            f"train.prefetch={t.prefetch!r} must be auto or an integer >= 0 (batches collated ahead; 0 = none)"
        )
    if t.max_time is not None and t.max_time < 0:
        raise ConfigError(
            f"train.max_time={t.max_time} must be >= 0 (seconds; 0 = no limit, null = the default budget)"
        )
    if t.max_updates <= 0 and t.max_epochs <= 0 and time_budget(t) <= 0:
        raise ConfigError("set at least one of train.max_updates, train.max_epochs, train.max_time")
    if t.best_metric not in ("bleu", "loss"):
        raise ConfigError(f"train.best_metric={t.best_metric!r} is not one of bleu, loss")
    if not 0.0 <= t.ema_decay < 1.0:
        raise ConfigError(f"train.ema_decay={t.ema_decay} must be in [0, 1) (0 turns the average off)")
    if t.log_every < 1:
        raise ConfigError(f"train.log_every={t.log_every} must be >= 1")
    try:
        resume_mode(t.resume)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for name in t.stop_signals:
        signal_number(name)
    for name in ("validate_every", "save_every", "keep_last", "average_last", "patience", "clip_norm"):
        if getattr(t, name) < 0:
            raise ConfigError(f"train.{name}={getattr(t, name)} must be >= 0")
    if t.onednn_cache_capacity is not None and t.onednn_cache_capacity < 0:
        raise ConfigError(
            f"train.onednn_cache_capacity={t.onednn_cache_capacity} must be >= 0 (0 = no cache) or null (oneDNN's default)"
        )
    validate_optim_config(cfg.optim)
    if cfg.data.train_max_target_tokens is not None and cfg.data.train_max_target_tokens < 1:
        raise ConfigError(
            f"data.train_max_target_tokens={cfg.data.train_max_target_tokens} must be >= 1 (or null: no limit)"
        )
    longest = max(cfg.data.max_source_positions, cfg.data.max_target_positions)
    if cfg.model.arch == "decoder_only":
        longest = cfg.data.max_source_positions + cfg.data.max_target_positions + 2
    if t.max_tokens < longest and t.max_tokens < 64:
        raise ConfigError(f"train.max_tokens={t.max_tokens} is too small for any sentence")
    if cfg.model.position.name == "learned" and cfg.model.max_positions < longest:
        raise ConfigError(
            f"model/position=learned has model.max_positions={cfg.model.max_positions} rows, fewer "
            f"than the longest sequence allowed by data.max_source_positions/max_target_positions "
            f"({longest})"
        )
    s = cfg.lr_scheduler
    if s.name not in LR_SCHEDULERS:
        raise ConfigError(f"lr_scheduler.name={s.name!r} is not one of {', '.join(LR_SCHEDULERS)}")
    if s.warmup_updates < 0:
        raise ConfigError(f"lr_scheduler.warmup_updates={s.warmup_updates} must be >= 0")
    if s.name == "inverse_sqrt" and s.warmup_updates == 0:
        raise ConfigError(
            "lr_scheduler=inverse_sqrt needs lr_scheduler.warmup_updates > 0 (the decay "
            "lr * sqrt(warmup / update) is anchored at the end of warmup); use lr_scheduler=constant "
            "or cosine for no warmup"
        )
    if s.name == "cosine" and t.max_updates <= 0:
        raise ConfigError(
            "lr_scheduler=cosine needs train.max_updates > 0 (the length of the cosine), e.g. "
            "lr_scheduler=cosine train.max_updates=4000; the default time budget gives it no length"
        )
    validate_generation_config(cfg.generation)
    validate_option_fields(cfg.model, cfg)  # validate(self) of lr_scheduler; validate_config(self, cfg) of every group


def validate_optim_config(o: Any) -> None:
    """Reject invalid ``optim.*`` settings (before any data is read).

    Raises:
        ConfigError: naming the offending fields.
    """
    if o.name not in ("adam", "adamw"):
        raise ConfigError(f"optim.name={o.name!r} is not one of adam, adamw")
    if not o.lr > 0:
        raise ConfigError(f"optim.lr={o.lr} must be > 0")
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas={list(o.betas)} must be two numbers in [0, 1)")
    if not o.eps > 0:
        raise ConfigError(f"optim.eps={o.eps} must be > 0")
    if o.weight_decay < 0:
        raise ConfigError(f"optim.weight_decay={o.weight_decay} must be >= 0")


def validate_generation_config(g: Any) -> None:
    """Reject invalid ``generation.*`` settings (training, ``translate.py`` and ``evaluate.py``).

    Raises:
        ConfigError: naming the offending fields.
    """
    if g.strategy not in ("greedy", "beam", "sample"):
        raise ConfigError(f"generation.strategy={g.strategy!r} is not one of greedy, beam, sample")
    if g.beam_size < 1 or g.nbest < 1 or (g.strategy == "beam" and g.nbest > g.beam_size):
        raise ConfigError(
            f"generation.beam_size={g.beam_size} must be >= 1 and generation.nbest={g.nbest} between 1 and beam_size"
        )
    if g.length_penalty_form not in ("gnmt", "fairseq"):
        raise ConfigError(f"generation.length_penalty_form={g.length_penalty_form!r} is not gnmt or fairseq")
    if not 0.0 < g.top_p <= 1.0:
        raise ConfigError(f"generation.top_p={g.top_p} must be in (0, 1]")
    if g.temperature < 0 or g.top_k < 0:
        raise ConfigError(f"generation.temperature={g.temperature} and generation.top_k={g.top_k} must be >= 0")


def check_checkpoint_averaging(t: Any) -> None:
    """Refuse a new run's ``train.average_last`` that its checkpoints cannot give (numbered checkpoints
    need ``train.save_every > 0``, and ``train.keep_last`` must keep enough).

    Raises:
        ConfigError: ``average_last > 0`` with ``save_every == 0``, or ``0 < keep_last < average_last``.
    """
    if t.average_last > 0 and t.save_every == 0:
        raise ConfigError(
            f"train.average_last={t.average_last} averages numbered checkpoints, which only "
            f"train.save_every > 0 writes (train.save_every=0): set both, e.g. train.save_every=500 "
            f"train.average_last={t.average_last}, or train.average_last=0"
        )
    if 0 < t.keep_last < t.average_last:
        raise ConfigError(
            f"train.average_last={t.average_last} cannot average more checkpoints than "
            f"train.keep_last={t.keep_last} keeps: raise train.keep_last (0 keeps every one)"
        )
