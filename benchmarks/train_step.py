"""One training step of a model under test, timed: the machinery of ``benchmarks/train_throughput.py``
that ``gpu_check/``, ``moe_throughput.py`` and ``profile_step.py`` share.

The models' presets and synthetic batches (:func:`preset`, :func:`make_batch`), their training FLOPs
(:func:`train_flops`), our model with its criterion (:class:`Ours`) and the peers
(:func:`model_under_test`, from ``peers.py``), the timed steps (:func:`time_steps`), one row
measured in a fresh process (:func:`worker`) or on a CUDA device (:func:`measure_on_cuda`), and the
machine's matmul peaks (:func:`matmul_peak`, :func:`cuda_matmul_peak`, :data:`DEVICE_PEAKS`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import resource
import time
from typing import Any

import torch

from benchmarks import REPO, prob, synchronize
from transformer.models import build_model
from transformer.models.flops import forward_flops
from transformer.modules.ffn import glu_hidden_size
from transformer.training.job.allocator import tune_cpu_allocator
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss
from transformer.training.step.optim import build_optimizer
from transformer.training.step.precision import cpu_has_fast_bf16

VOCAB = 8000
SRC_LEN = TGT_LEN = 24
LABEL_SMOOTHING = 0.1
SIZES = {
    # size: (enc-dec preset, decoder-only preset, batch rows on the CPU)
    "tiny": ("transformer_tiny", "llama_style_tiny", 96),
    "base": ("transformer_2017_base", "llama_style", 48),
    # last, so that profile_step.py's lookup of a preset's rows still finds llama_style at base size
    "small": ("transformer_small", "llama_style", 64),
}
PRESET_OVERRIDES: dict[tuple[str, str], list[str]] = {
    # (size, family): overrides of the preset. The decoder-only model at the small size is
    # llama_style at transformer_small's width and depth (3 + 3 = 6 layers, d_model 256, 4 heads),
    # d_ff 4 x d_model as at the other sizes
    ("small", "decoder-only"): ["model.n_decoder_layers=6", "model.d_model=256", "model.n_heads=4", "model.d_ff=1024"],
}
DEVICE_PEAKS: dict[str, dict[str, float]] = {
    # dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, FLOP/s; "fp32" is the
    # non-tensor-core FP32 rate (TF32 is off: torch.backends.cuda.matmul.allow_tf32 defaults to False).
    # Matched in this order against torch.cuda.get_device_name() (first substring that occurs).
    "H200 NVL": {"bf16": 835e12, "fp32": 60e12},
    "H200": {"bf16": 989e12, "fp32": 67e12},  # SXM (and GH200)
    "H100 PCIe": {"bf16": 756e12, "fp32": 51e12},
    "H100 NVL": {"bf16": 835e12, "fp32": 60e12},
    "H100": {"bf16": 989e12, "fp32": 67e12},  # SXM ("NVIDIA H100 80GB HBM3")
    "A100": {"bf16": 312e12, "fp32": 19.5e12},  # SXM4 and PCIe, 40 and 80 GB alike
    "L40S": {"bf16": 362e12, "fp32": 91.6e12},
    "L40": {"bf16": 181e12, "fp32": 90.5e12},
    "L4": {"bf16": 121e12, "fp32": 30.3e12},
}


# ----------------------------------------------------------------------------- configs and batches


def preset(name: str, overrides: list[str] | None = None) -> Any:
    """Compose ``configs/model/<name>.yaml`` with its nested defaults, as Hydra does."""
    from hydra import compose, initialize_config_dir

    from transformer.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"model={name}"] + list(overrides or []))
    return cfg.model, cfg.optim


def dims(cfg: Any) -> dict[str, Any]:
    """The sizes a peer needs to match a preset."""
    from transformer.config import resolve_n_kv_heads

    hidden = glu_hidden_size(cfg.d_model * 0 + cfg.d_ff, cfg.ffn.multiple_of) if cfg.ffn.glu_match_params else cfg.d_ff
    return {
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "n_kv_heads": resolve_n_kv_heads(cfg),
        "d_ff": cfg.d_ff,
        "ffn_hidden": hidden,
        "enc_layers": cfg.n_encoder_layers,
        "dec_layers": cfg.n_decoder_layers,
        "dropout": cfg.dropout,
        "label_smoothing": LABEL_SMOOTHING,
    }


def make_batch(arch: str, rows: int, src_len: int, tgt_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Uniform random tokens (ids 5..VOCAB-1, so no special or pad ids inside sentences)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(5, VOCAB, (rows, src_len), generator=g)
    tgt = torch.randint(5, VOCAB, (rows, tgt_len), generator=g)
    if arch == "encoder_decoder":
        return {"src": src, "prev": torch.cat((torch.full((rows, 1), 2), tgt[:, :-1]), 1), "target": tgt}
    # decoder-only: source (src_len - 1 ids + SEP) then target; loss on the target positions only
    tokens = torch.cat((src[:, :-1], torch.full((rows, 1), 4), tgt), 1)[:, :-1]  # (B, src_len + tgt_len - 1)
    tokens = torch.cat((tokens, torch.full((rows, 1), 3)), 1)  # (B, src_len + tgt_len)
    target = torch.cat((torch.zeros(rows, src_len - 1, dtype=torch.long), tgt, torch.full((rows, 1), 3)), 1)
    return {"tokens": tokens, "target": target}


def train_flops(cfg: Any, rows: int, src_len: int, tgt_len: int) -> float:
    """Training FLOPs of one step: 3 x forward, output layer counted at loss positions only."""
    if cfg.arch == "decoder_only":
        # forward_flops reads src_len + 1 + tgt_len tokens; the benchmark row has src_len + tgt_len
        f = forward_flops(cfg, VOCAB, src_len - 1, tgt_len)["total"]
        f -= 2 * (src_len - 1) * cfg.d_model * VOCAB  # no logits over the source (no loss there)
    else:
        f = forward_flops(cfg, VOCAB, src_len, tgt_len)["total"]
    return 3 * f * rows


# ----------------------------------------------------------------------------- models under test


class Ours(torch.nn.Module):
    """Our model + criterion: the fused output layer and loss of the trainer's step
    (:func:`~transformer.training.step.criterion.model_loss`), the mean over target tokens."""

    def __init__(self, cfg: Any, compile_model: bool = False, fused_loss: bool = True, vocab: int = VOCAB) -> None:
        super().__init__()
        self.model = build_model(cfg, vocab)
        self.arch = cfg.arch
        self.criterion = LabelSmoothedCrossEntropy(LABEL_SMOOTHING, ignore_index=0)
        self.unfused = not fused_loss  # False: the trainer's fused path
        if compile_model:  # the trainer's fused path with the layers compiled
            self.model.features = torch.compile(self.model.features)

    def step_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        net_input = (
            {"src_tokens": batch["src"], "prev_output_tokens": batch["prev"]}
            if self.arch == "encoder_decoder"
            else {"tokens": batch["tokens"]}
        )
        out = model_loss(self.model, self.criterion, net_input, batch["target"], self.model if self.unfused else None)
        return out["loss"] / out["ntokens"]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def time_steps(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    warmup: int,
    steps: int,
    precision: str = "fp32",
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Median and best step time (s) of ``steps`` steps after ``warmup``; the warmup step times.

    ``precision="bf16"`` runs the forward and loss under ``torch.autocast(<device type>, bfloat16)``
    (as the trainer does); the backward and the optimizer step follow autocast's dtypes. On CUDA
    (``device``; model and batch already there) every step is timed between two
    ``torch.cuda.synchronize`` calls.
    """
    model.train()
    device = torch.device("cpu") if device is None else device

    def step() -> float:
        synchronize(device)
        t = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        ctx = torch.autocast(device.type, dtype=DTYPES[precision]) if precision != "fp32" else contextlib.nullcontext()
        with ctx:
            loss = model.step_loss(batch)
        loss.backward()
        optimizer.step()
        synchronize(device)
        return time.perf_counter() - t

    warmup_s = [step() for _ in range(warmup)]
    gc.collect()
    times = sorted(step() for _ in range(steps))
    return {"step_s": times[len(times) // 2], "best_s": times[0], "warmup_s": warmup_s}


def make_optimizer(model: torch.nn.Module, optim_cfg: Any, device_type: str = "cpu") -> torch.optim.Optimizer:
    """Our builder's Adam for every model under test (same implementation for all; fused on CUDA)."""
    return build_optimizer(model, optim_cfg, device_type)


def our_dropout(cfg: Any) -> str:
    """The dropout our model applies (embeddings and residual branches; attention/FFN if set)."""
    extra = [f"{k} {prob(v)}" for k, v in (("attn", cfg.attention_dropout), ("ff", cfg.activation_dropout)) if v]
    return prob(cfg.dropout) + (f" (+ {', '.join(extra)})" if extra else "")


def prime_runtime(optim_cfg: Any) -> None:
    """One tiny forward/backward/optimizer step, so that lazy runtime set-up is not counted as a model's memory.

    Building the optimizer imports ~800 modules (``torch._dynamo`` and friends, ~70 MiB of RSS)
    and the first backward starts the autograd engine; every model pays that once, before its
    baseline RSS is read.
    """
    lin = torch.nn.Linear(16, 16)
    opt = make_optimizer(lin, optim_cfg)
    lin(torch.randn(4, 16)).sum().backward()
    opt.step()


def model_under_test(spec: dict[str, Any]) -> tuple[Any, Any, dict[str, torch.Tensor], Any]:
    """``(model config, optim config, batch on the CPU, constructor)`` of one row's ``spec``
    (see :func:`worker`); a peer's package is imported here (``peers.preload``)."""
    cfg, optim_cfg = preset(spec["preset"], spec.get("overrides"))
    batch = make_batch(cfg.arch, spec["rows"], spec["src_len"], spec["tgt_len"])
    if spec["model"] == "ours":

        def ctor() -> torch.nn.Module:
            return Ours(cfg, compile_model=spec.get("compile", False), fused_loss=spec.get("fused_loss", True))
    else:
        from benchmarks import peers

        peers.preload(spec["model"])  # module imports are not the model's memory
        table = peers.encdec_peers() if cfg.arch == "encoder_decoder" else peers.decoder_only_peers()
        pctor, d = table[spec["model"]], dims(cfg)

        def ctor() -> torch.nn.Module:
            return pctor(d, VOCAB)

    return cfg, optim_cfg, batch, ctor


def measure_on_cuda(spec: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """One row on a CUDA device, in this process: the step times of :func:`time_steps` and the
    peak memory the row allocated (``torch.cuda.max_memory_allocated`` after
    ``reset_peak_memory_stats``, minus what was allocated before the model was built: weights,
    gradients, Adam state, activations; the caching allocator's reserve is not counted)."""
    cfg, optim_cfg, batch, ctor = model_under_test(spec)
    gc.collect()
    torch.cuda.empty_cache()
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    torch.manual_seed(0)
    model = ctor().to(device)
    batch = {k: v.to(device) for k, v in batch.items()}
    opt = make_optimizer(model, optim_cfg, device.type)
    r = time_steps(model, batch, opt, spec["warmup"], spec["steps"], spec.get("precision", "fp32"), device)
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    r.update(
        mem_mb=(peak - before) / 2**20,
        params=sum(p.numel() for p in model.parameters()),
        dropout=our_dropout(cfg) if spec["model"] == "ours" else getattr(model, "dropout_desc", "?"),
        device=torch.cuda.get_device_name(device),
    )
    if spec.get("compile"):
        r["compile_s"] = r["warmup_s"][0]
    del model, opt, batch
    gc.collect()
    torch.cuda.empty_cache()
    return r


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Build one model in this (fresh) process, time its steps, measure its memory.

    ``spec``: ``model`` (``"ours"`` or a peer name of ``peers.py``), ``preset``, ``overrides``
    (Hydra), ``compile``, ``fused_loss``, ``rows``, ``src_len``, ``tgt_len``, ``warmup``, ``steps``,
    ``threads``, ``malloc``, ``precision`` (``fp32`` | ``bf16``), ``device`` (``cpu``, the default,
    or ``cuda``: see :func:`measure_on_cuda`).
    """
    torch.set_num_threads(spec["threads"])
    tuned = tune_cpu_allocator() if spec["malloc"] == "tuned" else False
    device = torch.device(spec.get("device", "cpu"))
    if device.type == "cuda":
        return {**measure_on_cuda(spec, device), "malloc_tuned": tuned}
    cfg, optim_cfg, batch, ctor = model_under_test(spec)
    prime_runtime(optim_cfg)
    gc.collect()
    before = _rss_mb()
    torch.manual_seed(0)
    model = ctor()
    opt = make_optimizer(model, optim_cfg)
    r = time_steps(model, batch, opt, spec["warmup"], spec["steps"], spec.get("precision", "fp32"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    r.update(
        mem_mb=peak - before,
        rss_before_mb=before,
        peak_rss_mb=peak,
        malloc_tuned=tuned,
        params=sum(p.numel() for p in model.parameters()),
        dropout=our_dropout(cfg) if spec["model"] == "ours" else getattr(model, "dropout_desc", "?"),
    )
    if spec.get("compile"):
        r["compile_s"] = r["warmup_s"][0]  # the first step traces and compiles
    return r


# ----------------------------------------------------------------------------- machine peak


def matmul_peak(reps: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best ``torch.mm`` rate (FLOP/s) in ``dtype`` over square sizes and the base model's FFN shape.

    One 2048^3 product alone under-reads the peak on some machine states (the base rows then show
    MFU > 100%), so the best over several shapes is taken. A dtype without hardware support (bf16
    on an AVX2 CPU) is probed on the smaller shapes only.
    """
    best_rate = 0.0
    shapes = ((1024, 1024, 1024), (2048, 2048, 2048), (1152, 512, 2048), (1152, 2048, 512))
    if dtype != torch.float32 and not cpu_has_fast_bf16():
        shapes, reps = (shapes[0], shapes[2]), 2
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        torch.mm(a, b)
        for _ in range(reps):
            t = time.perf_counter()
            torch.mm(a, b)
            best_rate = max(best_rate, 2 * m * k * n / (time.perf_counter() - t))
    return best_rate


def cuda_matmul_peak(device: torch.device, dtype: torch.dtype = torch.bfloat16, reps: int = 5) -> float:
    """Best ``torch.mm`` rate (FLOP/s) in ``dtype`` on a CUDA device over 4096^3 and 8192^3
    products (each timed between ``torch.cuda.synchronize`` calls, after one warm-up)."""
    best_rate = 0.0
    for n in (4096, 8192):
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        torch.mm(a, b)
        for _ in range(reps):
            synchronize(device)
            t = time.perf_counter()
            torch.mm(a, b)
            synchronize(device)
            best_rate = max(best_rate, 2 * n**3 / (time.perf_counter() - t))
        del a, b
    torch.cuda.empty_cache()
    return best_rate


def device_peak(name: str, precision: str) -> float | None:
    """The datasheet peak (FLOP/s) of a GPU named ``name`` (:data:`DEVICE_PEAKS`) at ``precision``
    (``bf16`` | ``fp32``), or None for a GPU the table does not know."""
    for key, peaks in DEVICE_PEAKS.items():
        if key in name:
            return peaks.get(precision)
    return None


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
