"""Typed configuration for every experiment.

The dataclasses here mirror the YAML files under ``configs/`` one to one (torchtitan style): Hydra
validates each YAML file against them through the ConfigStore (:func:`register_configs`), and
:func:`validate_config` rejects invalid *combinations* of fields before anything is built, with a
sentence that names the fields.

Modules in :mod:`transformer.modules` never see these classes; the builder
(:mod:`transformer.models.builder`) turns a :class:`ModelConfig` into explicit sizes and parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


class ConfigError(ValueError):
    """An invalid combination of configuration fields (the message names the fields)."""


# ----------------------------------------------------------------------------- model


@dataclass
class NormConfig:
    """``model/norm``: LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019)."""

    name: str = "layernorm"  # layernorm | rmsnorm
    eps: float = 1e-5


@dataclass
class FFNConfig:
    """``model/ffn``: the position-wise feed-forward block.

    ``relu``/``gelu`` use two matrices (Vaswani et al. 2017 §3.3); ``swiglu``/``geglu`` three
    (Shazeer 2020). With ``glu_match_params`` the GLU hidden size is ``2/3 * d_ff`` rounded up to a
    multiple of ``multiple_of`` so that the parameter count matches the two-matrix block.
    """

    name: str = "relu"  # relu | gelu | swiglu | geglu
    glu_match_params: bool = True
    multiple_of: int = 8


@dataclass
class PositionConfig:
    """``model/position``: how token order enters the model."""

    name: str = "sinusoidal"  # sinusoidal | learned | rope | alibi | none
    rope_theta: float = 10000.0


@dataclass
class ModelConfig:
    """``model``: one architecture. Presets live in ``configs/model/*.yaml``.

    ``arch=decoder_only`` stacks ``n_encoder_layers + n_decoder_layers`` causal layers so that
    flipping the switch keeps the depth; decoder-only presets set ``n_encoder_layers: 0``.
    ``n_kv_heads`` is set by the ``model/attention`` option (``mha``: null = n_heads, ``gqa``: 2,
    ``mqa``: 1) and can be overridden.
    """

    arch: str = "encoder_decoder"  # encoder_decoder | decoder_only
    norm_position: str = "post"  # post | pre
    attention: str = "mha"  # mha | gqa | mqa (set by the model/attention group)
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: Optional[int] = None
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    bias: bool = True
    scale_embeddings: bool = True
    tie_embeddings: str = "all"  # none | decoder | all
    max_positions: int = 1024
    init: str = "xavier"  # xavier (fairseq / the 2017 recipe) | normal (Llama style, std init_std)
    init_std: float = 0.02
    norm: NormConfig = field(default_factory=NormConfig)
    ffn: FFNConfig = field(default_factory=FFNConfig)
    position: PositionConfig = field(default_factory=PositionConfig)


# ----------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    """``data``: a parallel corpus, its SentencePiece vocabulary and length filters.

    ``root`` (or the environment variable ``TRANSFORMER_DATA_DIR``, or a user cache folder) holds
    ``{prefix}.{lang}`` files, plain or ``.gz``.
    """

    name: str = "multi30k_en_de"
    corpus: str = "multi30k"  # multi30k | multi30k_tok | parallel_text
    root: Optional[str] = None
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_prefix: str = "train"
    valid_prefix: str = "val"
    test_prefix: Optional[str] = "test_2016_flickr"
    test_splits: list[str] = field(default_factory=lambda: ["test_2016_flickr"])
    download: bool = True
    vocab_size: int = 8000
    spm_model_type: str = "bpe"  # bpe | unigram
    joint_vocab: bool = True
    character_coverage: float = 1.0
    max_source_positions: int = 256
    max_target_positions: int = 256
    bleu_tokenize: str = "13a"  # sacreBLEU tokenizer; "none" for the pre-tokenized multi30k_tok_*
    lowercase: bool = False
    cache_dir: Optional[str] = None


# ----------------------------------------------------------------------------- training


@dataclass
class OptimConfig:
    """``optim``: Adam/AdamW (Kingma & Ba 2015; betas and eps of Vaswani et al. 2017 §5.3)."""

    name: str = "adam"  # adam | adamw
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    fused: Optional[bool] = None  # None: fused on CUDA, foreach elsewhere


@dataclass
class SchedulerConfig:
    """``lr_scheduler``: ``inverse_sqrt`` (fairseq form, or the paper's ``noam`` form via
    ``form=noam``), ``cosine`` with warmup, or ``constant`` with warmup."""

    name: str = "inverse_sqrt"  # inverse_sqrt | cosine | constant
    warmup_updates: int = 4000
    form: str = "fairseq"  # fairseq (peak = optim.lr) | noam (d_model^-0.5 * scale)
    noam_scale: float = 1.0
    warmup_init_lr: float = 0.0
    min_lr: float = 0.0


@dataclass
class CriterionConfig:
    """``criterion``: label-smoothed cross entropy (Szegedy et al. 2016; Vaswani et al. §5.4)."""

    label_smoothing: float = 0.1


@dataclass
class GenerationConfig:
    """``generation``: search used for validation BLEU, the final test and ``translate.py``."""

    strategy: str = "beam"  # greedy | beam | sample
    beam_size: int = 5
    length_penalty: float = 0.6
    length_penalty_form: str = "gnmt"  # gnmt ((5+len)/6)^alpha | fairseq len^alpha
    max_len_a: float = 1.0
    max_len_b: int = 50
    min_len: int = 1
    no_repeat_ngram_size: int = 0
    nbest: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 8000


@dataclass
class TrainConfig:
    """``train``: the loop (fairseq names where they exist)."""

    max_tokens: int = 4096
    update_freq: int = 1
    clip_norm: float = 0.0
    max_updates: int = 0
    max_epochs: int = 0
    max_time: float = 0.0  # seconds; 0 = no limit
    precision: str = "auto"  # auto (bf16 where the device has fast bf16, else fp32) | fp32 | bf16 | fp16
    compile: bool = False
    device: str = "auto"
    num_threads: int = 0  # 0 = torch default
    tune_malloc: bool = True  # CPU: keep freed tensor memory in the process (glibc mallopt)
    validate_every: int = 1000
    valid_bleu: bool = True
    valid_bleu_subset: int = 0  # 0 = whole validation set
    best_metric: str = "bleu"  # bleu | loss
    patience: int = 0
    save_every: int = 0
    keep_last: int = 5
    average_last: int = 0  # average the last N saved checkpoints before the final test
    resume: bool = False
    log_every: int = 50
    progress: bool = True


@dataclass
class LoggerConfig:
    """``logger``: JSONL metrics always; optionally wandb (offline works) or tensorboard."""

    name: str = "none"  # none | wandb | tensorboard
    project: str = "transformer-zoo"
    mode: str = "offline"  # wandb mode


@dataclass
class Config:
    """The root config (``configs/train.yaml``)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lr_scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    criterion: CriterionConfig = field(default_factory=CriterionConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 1
    run_dir: Optional[str] = None
    experiment_name: str = "default"
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- validation

_CHOICES: dict[str, tuple[str, ...]] = {
    "model.arch": ("encoder_decoder", "decoder_only"),
    "model.norm_position": ("post", "pre"),
    "model.attention": ("mha", "gqa", "mqa"),
    "model.tie_embeddings": ("none", "decoder", "all"),
    "model.init": ("xavier", "normal"),
    "model.norm.name": ("layernorm", "rmsnorm"),
    "model.ffn.name": ("relu", "gelu", "swiglu", "geglu"),
    "model.position.name": ("sinusoidal", "learned", "rope", "alibi", "none"),
}


def _get(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def resolve_n_kv_heads(model: Any) -> int:
    """Number of key/value heads implied by ``model.attention`` and ``model.n_kv_heads``.

    Raises:
        ConfigError: when the two disagree (e.g. ``mha`` with ``n_kv_heads != n_heads``).
    """
    n_heads, n_kv = model.n_heads, model.n_kv_heads
    if model.attention == "mha":
        if n_kv not in (None, n_heads):
            raise ConfigError(
                f"model/attention=mha needs model.n_kv_heads == model.n_heads ({n_heads}) or null, "
                f"got model.n_kv_heads={n_kv}; use model/attention=gqa for fewer key/value heads"
            )
        return n_heads
    if model.attention == "mqa":
        if n_kv not in (None, 1):
            raise ConfigError(f"model/attention=mqa needs model.n_kv_heads=1 or null, got {n_kv}")
        return 1
    if n_kv is None:
        raise ConfigError("model/attention=gqa needs model.n_kv_heads (an integer dividing model.n_heads)")
    return int(n_kv)


def validate_model_config(model: Any, joint_vocab: bool = True) -> None:
    """Reject invalid model field combinations before anything is built.

    Args:
        model: a :class:`ModelConfig` (or a DictConfig with the same fields).
        joint_vocab: whether source and target share one vocabulary (``data.joint_vocab``).

    Raises:
        ConfigError: with a sentence naming the offending fields.
    """
    for key, choices in _CHOICES.items():
        value = _get({"model": model}, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")
    if model.d_model <= 0 or model.n_heads <= 0 or model.d_ff <= 0:
        raise ConfigError("model.d_model, model.n_heads and model.d_ff must be positive")
    if model.d_model % model.n_heads != 0:
        raise ConfigError(
            f"model.d_model={model.d_model} is not divisible by model.n_heads={model.n_heads}"
        )
    n_kv = resolve_n_kv_heads(model)
    if n_kv <= 0 or model.n_heads % n_kv != 0:
        raise ConfigError(
            f"model.n_heads={model.n_heads} is not divisible by model.n_kv_heads={n_kv}"
        )
    head_dim = model.d_model // model.n_heads
    if model.position.name == "rope" and head_dim % 2 != 0:
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
            "model.arch=decoder_only reads source and target in one sequence and needs "
            "data.joint_vocab=true"
        )
    if model.n_encoder_layers < 0 or model.n_decoder_layers < 0:
        raise ConfigError("model.n_encoder_layers and model.n_decoder_layers must be >= 0")
    if model.arch == "encoder_decoder" and (model.n_encoder_layers == 0 or model.n_decoder_layers == 0):
        raise ConfigError(
            "model.arch=encoder_decoder needs model.n_encoder_layers > 0 and model.n_decoder_layers > 0"
        )
    if model.arch == "decoder_only" and model.n_encoder_layers + model.n_decoder_layers == 0:
        raise ConfigError("model.arch=decoder_only needs model.n_encoder_layers + model.n_decoder_layers > 0")
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        p = getattr(model, name)
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"model.{name}={p} must be in [0, 1)")


def validate_config(cfg: Any) -> None:
    """Validate a whole :class:`Config` (model, data, optimisation, generation) before any work.

    Raises:
        ConfigError: naming the offending fields.
    """
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, DictConfig):  # catches keys appended with Hydra's "+" that the schema lacks
        try:
            OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
        except OmegaConfBaseException as err:
            raise ConfigError(f"unknown or mistyped field: {err}".splitlines()[0]) from None
    validate_model_config(cfg.model, joint_vocab=cfg.data.joint_vocab)
    t = cfg.train
    if t.precision not in ("auto", "fp32", "bf16", "fp16"):
        raise ConfigError(f"train.precision={t.precision!r} is not one of auto, fp32, bf16, fp16")
    if t.max_tokens <= 0:
        raise ConfigError(f"train.max_tokens={t.max_tokens} must be positive")
    if t.update_freq < 1:
        raise ConfigError(f"train.update_freq={t.update_freq} must be >= 1")
    if t.max_updates <= 0 and t.max_epochs <= 0 and t.max_time <= 0:
        raise ConfigError("set at least one of train.max_updates, train.max_epochs, train.max_time")
    if t.best_metric not in ("bleu", "loss"):
        raise ConfigError(f"train.best_metric={t.best_metric!r} is not one of bleu, loss")
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
    if s.name not in ("inverse_sqrt", "cosine", "constant"):
        raise ConfigError(f"lr_scheduler.name={s.name!r} is not one of inverse_sqrt, cosine, constant")
    if s.warmup_updates < 0:
        raise ConfigError(f"lr_scheduler.warmup_updates={s.warmup_updates} must be >= 0")
    if s.name == "inverse_sqrt" and s.warmup_updates == 0:
        raise ConfigError(
            "lr_scheduler=inverse_sqrt needs lr_scheduler.warmup_updates > 0 (the decay "
            "lr * sqrt(warmup / update) is anchored at the end of warmup); use lr_scheduler=constant "
            "or cosine for no warmup"
        )
    if s.name == "cosine" and t.max_updates <= 0:
        raise ConfigError("lr_scheduler=cosine needs train.max_updates > 0 (the length of the cosine)")
    validate_generation_config(cfg.generation)


def validate_generation_config(g: Any) -> None:
    """Reject invalid ``generation.*`` settings (training, ``translate.py`` and ``evaluate.py``).

    Raises:
        ConfigError: naming the offending fields.
    """
    if g.strategy not in ("greedy", "beam", "sample"):
        raise ConfigError(f"generation.strategy={g.strategy!r} is not one of greedy, beam, sample")
    if g.beam_size < 1 or g.nbest < 1 or (g.strategy == "beam" and g.nbest > g.beam_size):
        raise ConfigError(
            f"generation.beam_size={g.beam_size} must be >= 1 and generation.nbest={g.nbest} between 1 "
            "and beam_size"
        )
    if g.length_penalty_form not in ("gnmt", "fairseq"):
        raise ConfigError(f"generation.length_penalty_form={g.length_penalty_form!r} is not gnmt or fairseq")
    if not 0.0 < g.top_p <= 1.0:
        raise ConfigError(f"generation.top_p={g.top_p} must be in (0, 1]")
    if g.temperature < 0 or g.top_k < 0:
        raise ConfigError(f"generation.temperature={g.temperature} and generation.top_k={g.top_k} must be >= 0")


def register_configs() -> None:
    """Register the structured configs with Hydra's ConfigStore.

    ``configs/train.yaml`` names ``base_config`` first in its defaults list, so every YAML value is
    type-checked against :class:`Config` (an unknown key or a wrong type fails at composition).
    """
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)


__all__ = [
    "MISSING",
    "Config",
    "ConfigError",
    "CriterionConfig",
    "DataConfig",
    "FFNConfig",
    "GenerationConfig",
    "LoggerConfig",
    "ModelConfig",
    "NormConfig",
    "OptimConfig",
    "PositionConfig",
    "SchedulerConfig",
    "TrainConfig",
    "register_configs",
    "resolve_n_kv_heads",
    "validate_config",
    "validate_generation_config",
    "validate_model_config",
]
