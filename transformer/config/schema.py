"""The dataclasses of every experiment's configuration, one per config group, mirroring the YAML
files under ``configs/`` (torchtitan style); Hydra validates each file against them. Every field
declares its rule (:mod:`transformer.config.rules`): ``recipe(default)`` for what a run computes,
``rule(default, resume=..., grouping=...)`` otherwise. The fields: docs/switches.md."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Optional, get_type_hints

from transformer.config.rules import recipe, rule

__all__ = [
    "AttentionConfig",
    "Config",
    "ConfigError",
    "CriterionConfig",
    "DataConfig",
    "FFNConfig",
    "GenerationConfig",
    "LatentAttentionConfig",
    "LoggerConfig",
    "ModelConfig",
    "NormConfig",
    "OptimConfig",
    "PositionConfig",
    "RopeScalingConfig",
    "SchedulerConfig",
    "TrainConfig",
    "GenerationOverrides",
    "RopeScalingOverrides",
]


class ConfigError(ValueError):
    """An invalid combination of configuration fields (the message names the fields)."""


# ----------------------------------------------------------------------------- model


@dataclass
class NormConfig:
    """``model/norm``: LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019)."""

    name: str = recipe("layernorm")  # a key of transformer.modules.norms.NORMS
    eps: float = recipe(1e-5)


@dataclass
class FFNConfig:
    """``model/ffn``: the position-wise feed-forward block: ``relu``/``gelu`` two matrices (Vaswani et al.
    2017 §3.3), ``swiglu``/``geglu`` three (Shazeer 2020; ``glu_match_params``: width ``2/3 * d_ff``
    rounded up to ``multiple_of``), ``moe`` a mixture of experts whose fields follow ``multiple_of``."""

    name: str = recipe("relu")  # a key of transformer.modules.ffn.FFNS
    glu_match_params: bool = recipe(True)
    multiple_of: int = recipe(8)
    # name=moe (transformer/modules/moe.py; HF names in brackets): n_experts routed experts, each
    # a model.ffn.expert block of width expert_d_ff (null: model.d_ff; GLU-sized as above), top_k
    # of them per token, plus n_shared_experts always-on experts (one block n_shared x as wide)
    expert: str = recipe("swiglu")  # a key of FFNS other than moe
    n_experts: int = recipe(8)  # [num_local_experts]
    top_k: int = recipe(2)  # [num_experts_per_tok]
    n_shared_experts: int = recipe(0)  # [n_shared_experts] (DeepSeek)
    expert_d_ff: int | None = recipe(None)  # [moe_intermediate_size before GLU sizing]
    # a key of transformer.modules.moe_router.ROUTER_SCORES: softmax (Mixtral) | sigmoid (DeepSeek-V3)
    router: str = recipe("softmax")
    # renormalise the top-k weights to sum to 1 (Mixtral, DeepSeek-V3; Switch: false)
    norm_topk_prob: bool = recipe(True)
    routed_scaling_factor: float = recipe(1.0)  # multiplies the routed experts' weights (DeepSeek-V3: 2.5)
    router_aux_loss_coef: float = recipe(0.01)  # load-balancing loss weight (Switch eq. 4 alpha); 0 = off
    router_z_loss_coef: float = recipe(0.0)  # router z-loss weight (ST-MoE: 1e-3); 0 = off
    bias_update_speed: float = recipe(0.0)  # DeepSeek-V3 aux-loss-free balance gamma (0.001 there); 0 = off


@dataclass
class RopeScalingConfig:
    """``model.position.rope_scaling``: stretching RoPE past the trained length (HF ``rope_parameters``
    names). ``rope_type`` is a key of ``transformer.modules.rope_scaling.ROPE_SCALINGS``; ``default``
    (the default) is unscaled RoPE and reads none of the other fields."""

    rope_type: str = recipe("default")  # default | linear | ntk | dynamic | yarn | llama3
    factor: float = recipe(1.0)  # context extension factor s (>= 1; 8 in Llama 3.1)
    # the trained length L0 (dynamic: null = model.max_positions)
    original_max_position_embeddings: int | None = recipe(None)
    low_freq_factor: float = recipe(1.0)  # llama3
    high_freq_factor: float = recipe(4.0)  # llama3
    beta_fast: float = recipe(32.0)  # yarn
    beta_slow: float = recipe(1.0)  # yarn
    attention_factor: float | None = recipe(None)  # yarn: factor on cos/sin; null = 0.1 ln(factor) + 1


@dataclass
class PositionConfig:
    """``model/position``: how token order enters the model."""

    name: str = recipe("sinusoidal")  # a key of transformer.modules.positions.POSITIONS
    rope_theta: float = recipe(10000.0)
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)  # RoPE only


@dataclass
class AttentionConfig:
    """``model/attention``: the self-attention kind and its key/value heads (``mha``: null = n_heads,
    ``gqa``: a divisor, ``mqa``: 1, ``mla``: null). An option with sizes of its own subclasses it
    (:class:`LatentAttentionConfig`); older flat records are read through
    :func:`transformer.config.convert.upgrade_config`."""

    name: str = recipe("mha")  # a key of transformer.modules.attention.ATTENTION_KINDS
    n_kv_heads: int | None = recipe(None)


@dataclass
class LatentAttentionConfig(AttentionConfig):
    """``model/attention=mla``: multi-head latent attention (DeepSeek-V2 §2.1; HF ``DeepseekV3Config``
    names). A null size is derived from ``head_dim = d_model / n_heads`` in V2's proportions
    (:func:`transformer.config.sizes.latent_sizes`)."""

    name: str = recipe("mla")
    kv_lora_rank: int | None = recipe(None)  # latent width (null: 4 * head_dim, V2's 512 = 4 x 128)
    q_lora_rank: int | None = recipe(None)  # low-rank queries (null: a full query projection, as V2-Lite)
    qk_nope_head_dim: int | None = recipe(None)  # per-head query/key width without RoPE (null: head_dim)
    # decoupled RoPE width (null: head_dim / 2 rounded to even with RoPE, else 0)
    qk_rope_head_dim: int | None = recipe(None)
    v_head_dim: int | None = recipe(None)  # per-head value width (null: head_dim)


@dataclass
class ModelConfig:
    """``model``: one architecture; presets in ``configs/model/*.yaml`` list only what they change.

    The defaults are ``model=transformer_small``: the 2017 Transformer (post-LN, ReLU, sinusoidal, MHA,
    shared embeddings) at 3+3 layers, d_model 256, 4 heads, d_ff 512, dropout 0.1.
    ``arch=decoder_only`` stacks ``n_encoder_layers + n_decoder_layers`` causal layers, keeping the depth."""

    arch: str = recipe("encoder_decoder")  # encoder_decoder | decoder_only
    norm_position: str = recipe("post")  # a key of transformer.modules.residual.RESIDUALS
    n_encoder_layers: int = recipe(3)
    n_decoder_layers: int = recipe(3)
    d_model: int = recipe(256)
    n_heads: int = recipe(4)
    d_ff: int = recipe(512)
    dropout: float = recipe(0.1)
    attention_dropout: float = recipe(0.0)
    activation_dropout: float = recipe(0.0)
    bias: bool = recipe(True)
    scale_embeddings: bool = recipe(True)
    tie_embeddings: str = recipe("all")  # none | decoder | all
    max_positions: int = recipe(1024)
    init: str = recipe("xavier")  # xavier (fairseq / the 2017 recipe) | normal (Llama style, std init_std)
    init_std: float = recipe(0.02)
    # QK-norm (Qwen3, OLMo 2): none | a key of transformer.modules.norms.NORMS, over each head (eps model.norm.eps)
    qk_norm: str = recipe("none")
    # sliding-window self-attention (Mistral): each query sees the last attention_window positions; null = global
    attention_window: int | None = recipe(None)
    # with a window: every N-th layer stays global (Gemma 2: 2, Gemma 3: 6); 0 = every layer local
    attention_window_pattern: int = recipe(0)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    ffn: FFNConfig = field(default_factory=FFNConfig)
    position: PositionConfig = field(default_factory=PositionConfig)


# ----------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    """``data``: a parallel corpus, its SentencePiece vocabulary and length filters; the defaults are
    ``data=multi30k_en_de`` (8,000 joint BPE pieces, four test sets)."""

    name: str = recipe("multi30k_en_de")
    corpus: str = recipe("multi30k")  # multi30k | multi30k_tok | parallel_text
    root: str | None = rule(None, resume="free", grouping="ignored")  # where the data is: free on resume
    src_lang: str = recipe("en")
    tgt_lang: str = recipe("de")
    train_prefix: str = recipe("train")
    valid_prefix: str = recipe("val")
    test_prefix: str | None = recipe("test_2016_flickr")
    test_splits: list[str] = recipe(
        factory=lambda: ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"]
    )
    download: bool = rule(True, resume="free", grouping="ignored")
    vocab_size: int = recipe(8000)
    spm_model_type: str = recipe("bpe")  # bpe | unigram
    joint_vocab: bool = recipe(True)
    character_coverage: float = recipe(1.0)
    max_source_positions: int = recipe(256)
    max_target_positions: int = recipe(256)
    # training pairs whose target has more than N subword tokens (EOS not counted) are removed, the
    # validation and test sets kept whole: a length-generalization study's training length L; null = none
    train_max_target_tokens: int | None = recipe(None)
    bleu_tokenize: str = recipe("13a")  # sacreBLEU tokenizer; "none" for the pre-tokenized multi30k_tok_*
    lowercase: bool = recipe(False)
    # binarized data: <cache_dir>/<name>-<key>/ (default ~/.cache/transformer_zoo/cache)
    cache_dir: str | None = rule(None, resume="free", grouping="ignored")
    # a folder written by scripts/preprocess.py: read it, no raw file needed
    binarized: str | None = rule(None, resume="free", grouping="ignored")
    spm_input_sentence_size: int = recipe(2_000_000)  # SentencePiece trains on a random sample of this many lines
    # encoding processes when binarizing; 0 = one per CPU
    preprocess_workers: int = rule(0, resume="free", grouping="ignored")


# ----------------------------------------------------------------------------- training


@dataclass
class OptimConfig:
    """``optim``: Adam/AdamW (Kingma & Ba 2015; betas and eps of Vaswani et al. 2017 §5.3)."""

    name: str = recipe("adam")  # adam | adamw
    lr: float = recipe(2e-3)  # the default run's peak (transformer_small on Multi30k); experiments set their own
    betas: tuple[float, float] = recipe((0.9, 0.98))
    eps: float = recipe(1e-9)
    weight_decay: float = recipe(0.0)
    fused: bool | None = recipe(None)  # None: fused on CUDA, foreach elsewhere


@dataclass
class SchedulerConfig:
    """``lr_scheduler``: ``inverse_sqrt`` (fairseq form, or the paper's ``noam`` form via
    ``form=noam``), ``cosine`` with warmup, or ``constant`` with warmup."""

    name: str = recipe("inverse_sqrt")  # inverse_sqrt | cosine | constant
    warmup_updates: int = recipe(400)
    form: str = recipe("fairseq")  # fairseq (peak = optim.lr) | noam (d_model^-0.5 * scale)
    noam_scale: float = recipe(1.0)
    warmup_init_lr: float = recipe(0.0)
    min_lr: float = recipe(0.0)


@dataclass
class CriterionConfig:
    """``criterion``: label-smoothed cross entropy (Szegedy et al. 2016; Vaswani et al. §5.4)."""

    label_smoothing: float = recipe(0.1)


@dataclass
class GenerationConfig:
    """``generation``: search used for validation BLEU, the final test and ``translate.py``."""

    strategy: str = recipe("beam")  # greedy | beam | sample
    beam_size: int = recipe(5)
    length_penalty: float = recipe(0.6)
    length_penalty_form: str = recipe("gnmt")  # gnmt ((5+len)/6)^alpha | fairseq len^alpha
    max_len_a: float = recipe(1.2)  # a hypothesis has at most max_len_a * source length + max_len_b tokens
    max_len_b: int = recipe(10)
    min_len: int = recipe(1)
    no_repeat_ngram_size: int = recipe(0)
    nbest: int = recipe(1)
    temperature: float = recipe(1.0)
    top_k: int = recipe(0)
    top_p: float = recipe(1.0)
    seed: int = recipe(0)
    max_tokens: int = recipe(8000)


def _overrides_of(cls: type) -> type:
    """A dataclass with the fields of ``cls``, each optional and null by default."""
    hints = get_type_hints(cls)
    name = f"{cls.__name__[: -len('Config')]}Overrides"
    return make_dataclass(name, [(f.name, Optional[hints[f.name]], None) for f in fields(cls)])  # noqa: UP045 (a runtime type: typing's Optional of any hint)


GenerationOverrides = _overrides_of(GenerationConfig)
GenerationOverrides.__module__ = __name__
GenerationOverrides.__doc__ = """``generation`` of ``translate.yaml`` / ``evaluate.yaml``: the fields of :class:`GenerationConfig`,
each null by default, meaning "keep the run's value" (see
:func:`~transformer.generation.loading.merge_generation`); set on the command line, e.g.
``generation.beam_size=10``, they override it. Derived from :class:`GenerationConfig`, so a new
generation setting is one field there."""

RopeScalingOverrides = _overrides_of(RopeScalingConfig)
RopeScalingOverrides.__module__ = __name__
RopeScalingOverrides.__doc__ = """``model.position.rope_scaling`` of ``translate.yaml`` / ``evaluate.yaml``: a RoPE scaling applied
at test time only, to a run trained without it (or with another). The fields of :class:`RopeScalingConfig`
under the same names as in training, each null by default ("keep the run's value"); e.g.
``model.position.rope_scaling.rope_type=dynamic model.position.rope_scaling.factor=2`` (see
:func:`~transformer.generation.overrides.test_time_overrides`)."""


@dataclass
class TrainConfig:
    """``train``: the loop (fairseq names where they exist). The defaults are the default run's
    (``python scripts/train.py``): 4096 tokens per update, 23 minutes of training
    (:func:`~transformer.config.runtime.time_budget`), validation every 500 updates (loss, and BLEU on 200 pairs)."""

    max_tokens: int = recipe(4096)
    # round batch widths up to a multiple and keep each batch within one rounded length, so an epoch
    # has a few dozen (rows, length) shapes (transformer/data/batching.py); 1 = greedy packing, no rounding
    # (a saved config without this field reads as 1: transformer.config.convert.upgrade_config)
    # auto = by device and precision (transformer.data.batching.AUTO_PAD_TO_MULTIPLE: 1 on a CPU,
    # 8 on CUDA); the run records the number it resolved to
    pad_to_multiple: Any = recipe("auto")
    update_freq: int = recipe(1)
    clip_norm: float = recipe(0.0)
    # when to stop: a resume may train longer (or stop sooner); the budget still tells configurations apart
    max_updates: int = rule(0, resume="free", grouping="defines")
    max_epochs: int = rule(0, resume="free", grouping="defines")
    # seconds of training; null (the default) = DEFAULT_TIME_BUDGET_S when neither max_updates nor
    # max_epochs is set, else no limit (an explicit update budget replaces the default time budget); 0 = no limit
    max_time: float | None = rule(None, resume="free", grouping="defines")
    precision: str = recipe("auto")  # auto (bf16 where the device has fast bf16, else fp32) | fp32 | bf16 | fp16
    # torch.compile of the training step: auto = on accelerators, eager on a CPU
    # (transformer.training.step.compiled.AUTO_COMPILE); the run records what auto resolved to
    compile: Any = rule("auto", resume="free", grouping="defines")  # how it computes, not what
    # the machine: free on resume; the device kind is compared from results.json, not from here
    device: str = rule("auto", resume="free", grouping="ignored")
    num_threads: int = rule(0, resume="free", grouping="ignored")  # 0 = torch default
    # CPU: keep freed tensor memory in the process (glibc mallopt)
    tune_malloc: bool = rule(True, resume="free", grouping="defines")
    # CPU: oneDNN primitive cache entries (ONEDNN_PRIMITIVE_CACHE_CAPACITY) for bf16 matmuls; null = oneDNN's 1024
    onednn_cache_capacity: int | None = rule(64, resume="free", grouping="ignored")
    validate_every: int = recipe(500)
    valid_bleu: bool = recipe(True)
    valid_bleu_subset: int = recipe(200)  # the first N validation pairs are translated for BLEU; 0 = the whole set
    best_metric: str = recipe("loss")  # bleu | loss
    patience: int = rule(0, resume="free", grouping="defines")  # when to stop
    save_every: int = recipe(0)
    keep_last: int = recipe(5)
    average_last: int = recipe(0)  # average the last N saved checkpoints before the final test
    # exponential moving average of the weights (e.g. 0.999); 0 = off; may start (or stop) at a
    # resume (Trainer.load_state)
    ema_decay: float = rule(0.0, resume="free", grouping="defines")
    # false: a new run | true: continue from the run folder's checkpoint_last (start when it has none)
    # | auto: as true, and a run that is already complete is left as it is (nothing trained or written)
    resume: Any = rule(False, resume="always", grouping="ignored")
    # continue from this checkpoint (a checkpoint_* file or stem, any folder) instead; implies resume
    resume_from: str | None = rule(None, resume="always", grouping="defines")
    # a folder of finished runs' small files (e.g. docs/results/ladder/runs): a job whose run folder holds
    # no checkpoint and whose twin <finished_runs>/<run folder name>/results.json trained the same
    # config is not trained again (transformer/training/job/finished_runs.py); null = not looked for
    finished_runs: str | None = rule(None, resume="free", grouping="ignored")
    log_every: int = rule(50, resume="free", grouping="ignored")  # what to show
    progress: bool = rule(True, resume="free", grouping="ignored")
    # signals that stop training politely: finish the update, save checkpoint_last, exit with status 75
    # (transformer/training/stopping.py); SLURM/scancel send SIGTERM, submitit's preemption signal is USR2
    stop_signals: list[str] = rule(
        factory=lambda: ["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"], resume="fixed", grouping="ignored"
    )
    # batches collated this many ahead of the step in a background thread, pinned and copied without
    # the host waiting on CUDA; 0 = collated in the training loop; auto = by device
    # (transformer.data.prefetch.AUTO_PREFETCH). Where batches are made, not what they hold
    prefetch: Any = rule("auto", resume="free", grouping="ignored")
    # under torchrun: ddp (DistributedDataParallel) | fsdp (FSDP2, sharded); how it computes, not what
    distributed: str = rule("ddp", resume="free", grouping="defines")
    # DDP's gradient bucket size (MiB) and static_graph (the same parameters train every update)
    bucket_cap_mb: float = rule(25.0, resume="free", grouping="ignored")
    static_graph: bool = rule(False, resume="free", grouping="ignored")
    # the dtype gradients cross the network in under torchrun: fp32 | bf16 (half the bytes, rounded)
    grad_reduce_dtype: str = rule("fp32", resume="free", grouping="defines")
    # seconds a collective waits for the other ranks (a rank saving or testing alone meanwhile)
    dist_timeout: float = rule(1800.0, resume="free", grouping="ignored")
    # FSDP2: free each layer's gathered weights after its forward (true) or keep them for the backward
    reshard_after_forward: bool = rule(True, resume="free", grouping="ignored")
    # recompute each layer's activations in the backward pass
    activation_checkpointing: bool = rule(False, resume="free", grouping="defines")


@dataclass
class LoggerConfig:
    """``logger``: JSONL metrics always; optionally wandb (offline works) or tensorboard. Its fields
    follow the rule of :attr:`Config.logger` (free on resume, no part of a configuration)."""

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
    logger: LoggerConfig = rule(factory=LoggerConfig, resume="free", grouping="ignored")  # what to show, where
    seed: int = rule(1, resume="fixed", grouping="ignored")  # a configuration's runs are its seeds
    run_dir: str | None = rule(None, resume="always", grouping="ignored")
    # the study a run was launched by (and its default output folder), not what it computes: a branch
    # study's runs (branches) share one table with the ladder runs they branch off (ladder)
    experiment_name: str = rule("default", resume="fixed", grouping="ignored")
    extra: dict[str, Any] = recipe(factory=dict)
    # the user's own options (transformer/plugins.py): folders (Python packages), .py files or module
    # names, imported before the config is validated; their configs/ joins Hydra's search path. Where
    # they are may change on resume; their files must be the ones recorded (plugin_files)
    plugins: list[str] = rule(factory=list, resume="free", grouping="ignored")
    # import a run folder's recorded copy of a plugin that is not where it was (or changed)
    plugins_trust: bool = rule(False, resume="free", grouping="ignored")
    # recorded by the run, not set by hand: <plugin>/<file> -> sha256 of the plugin files it imported
    plugin_files: dict[str, str] = recipe(factory=dict)
