"""The dataclasses of every experiment's configuration, one per config group.

They mirror the YAML files under ``configs/`` one to one (torchtitan style): Hydra validates each
YAML file against them through the ConfigStore (:func:`register_configs`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

__all__ = [
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
    "GenerationOverrides",
    "register_configs",
]


class ConfigError(ValueError):
    """An invalid combination of configuration fields (the message names the fields)."""


# ----------------------------------------------------------------------------- model


@dataclass
class NormConfig:
    """``model/norm``: LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019)."""

    name: str = "layernorm"  # a key of transformer.modules.norms.NORMS
    eps: float = 1e-5


@dataclass
class FFNConfig:
    """``model/ffn``: the position-wise feed-forward block.

    ``relu``/``gelu`` use two matrices (Vaswani et al. 2017 §3.3); ``swiglu``/``geglu`` three
    (Shazeer 2020). With ``glu_match_params`` the GLU hidden size is ``2/3 * d_ff`` rounded up to a
    multiple of ``multiple_of`` so that the parameter count matches the two-matrix block.

    ``moe`` is a mixture of experts (Fedus et al. 2021; Jiang et al. 2024; DeepSeek-AI 2024): the
    fields after ``multiple_of`` size and route it and are read by that option only.
    """

    name: str = "relu"  # a key of transformer.modules.ffn.FFNS
    glu_match_params: bool = True
    multiple_of: int = 8
    # name=moe (transformer/modules/moe.py; HF names in brackets): n_experts routed experts, each
    # a model.ffn.expert block of width expert_d_ff (null: model.d_ff; GLU-sized as above), top_k
    # of them per token, plus n_shared_experts always-on experts (one block n_shared x as wide)
    expert: str = "swiglu"  # a key of FFNS other than moe
    n_experts: int = 8  # [num_local_experts]
    top_k: int = 2  # [num_experts_per_tok]
    n_shared_experts: int = 0  # [n_shared_experts] (DeepSeek)
    expert_d_ff: Optional[int] = None  # [moe_intermediate_size before GLU sizing]
    router: str = "softmax"  # a key of transformer.modules.moe.ROUTER_SCORES: softmax (Mixtral) | sigmoid (DeepSeek-V3)
    norm_topk_prob: bool = True  # renormalise the top-k weights to sum to 1 (Mixtral, DeepSeek-V3; Switch: false)
    routed_scaling_factor: float = 1.0  # multiplies the routed experts' weights (DeepSeek-V3: 2.5)
    router_aux_loss_coef: float = 0.01  # load-balancing loss weight (Switch eq. 4 alpha); 0 = off
    router_z_loss_coef: float = 0.0  # router z-loss weight (ST-MoE: 1e-3); 0 = off
    bias_update_speed: float = 0.0  # DeepSeek-V3 aux-loss-free balance gamma (0.001 there); 0 = off


@dataclass
class PositionConfig:
    """``model/position``: how token order enters the model."""

    name: str = "sinusoidal"  # a key of transformer.modules.positions.POSITIONS
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
    norm_position: str = "post"  # a key of transformer.modules.residual.RESIDUALS
    attention: str = "mha"  # a key of transformer.modules.attention.ATTENTION_KINDS (set by model/attention)
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
    cache_dir: Optional[str] = None  # binarized data: <cache_dir>/<name>-<key>/ (default ~/.cache/transformer_zoo/cache)
    binarized: Optional[str] = None  # a folder written by scripts/preprocess.py: read it, no raw file needed
    spm_input_sentence_size: int = 2_000_000  # SentencePiece trains on a random sample of this many lines
    preprocess_workers: int = 0  # encoding processes when binarizing; 0 = one per CPU


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


def _overrides_of(cls: type) -> type:
    """A dataclass with the fields of ``cls``, each optional and null by default."""
    hints = get_type_hints(cls)
    return make_dataclass(f"{cls.__name__[: -len('Config')]}Overrides", [(f.name, Optional[hints[f.name]], None) for f in fields(cls)])


GenerationOverrides = _overrides_of(GenerationConfig)
GenerationOverrides.__module__ = __name__
GenerationOverrides.__doc__ = """``generation`` of ``translate.yaml`` / ``evaluate.yaml``: the fields of :class:`GenerationConfig`,
each null by default, meaning "keep the run's value" (see
:func:`~transformer.generation.loading.merge_generation`); set on the command line, e.g.
``generation.beam_size=10``, they override it. Derived from :class:`GenerationConfig`, so a new
generation setting is one field there."""


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
    ema_decay: float = 0.0  # exponential moving average of the weights (e.g. 0.999); 0 = off
    resume: bool = False  # continue the run in the run folder from its checkpoint_last
    # continue from this checkpoint (a checkpoint_* file or stem, any folder) instead; implies resume
    resume_from: Optional[str] = None
    log_every: int = 50
    progress: bool = True
    distributed: str = "ddp"  # under torchrun: ddp (DistributedDataParallel) | fsdp (FSDP2, sharded)
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward pass


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


def hydra_subdir(resume: Any = False, resume_from: Any = None) -> str:
    """Where Hydra records a training job in its run folder (``hydra.output_subdir`` of
    ``configs/train.yaml``, as the resolver ``${zoo.hydra_subdir:${train.resume},${train.resume_from}}``).

    Returns:
        ``.hydra`` for a new run; ``.hydra/resume-<date>_<time>`` for a resumed one, so that the
        run's own record (its config, choices and overrides) is never overwritten.
    """
    resuming = str(resume).lower() == "true" or str(resume_from or "").lower() not in ("", "none", "null")
    return ".hydra/resume-" + time.strftime("%Y-%m-%d_%H-%M-%S") if resuming else ".hydra"


if not OmegaConf.has_resolver("zoo.hydra_subdir"):  # at import: jobs unpickled on a cluster node have it too
    OmegaConf.register_new_resolver("zoo.hydra_subdir", hydra_subdir, use_cache=True)


def register_configs() -> None:
    """Register the structured configs with Hydra's ConfigStore.

    ``configs/train.yaml`` names ``base_config`` first in its defaults list, so every YAML value is
    type-checked against :class:`Config` (an unknown key or a wrong type fails at composition).
    """
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="generation_overrides", node=GenerationOverrides)
