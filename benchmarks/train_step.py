"""One training step of a model under test, timed: the machinery of ``benchmarks/train_throughput.py``
that ``gpu_check/``, ``moe_throughput.py`` and ``profile_step.py`` share; a library, no command line.

The models' presets and synthetic batches (:func:`preset`, :func:`make_batch`), their training FLOPs
(:func:`train_flops`), our model's update as the trainer runs it (:func:`trainer_under_test`:
:meth:`Trainer.train_step <transformer.training.loop.trainer.Trainer.train_step>` with its clipping,
loss scaling, token normalisation and schedule), our model with its criterion alone (:class:`Ours`,
for the profiler, the loss ablation and the CUDA-graph rows) and the peers (:func:`model_under_test`,
from ``peers.py``) with a hand-written step (:func:`hand_step`: they have no trainer of ours), the
timed steps (:func:`time_steps`), one row measured in this process (:func:`worker`), and the peak a
row's MFU is read against (:func:`flops_peak`, :data:`DEVICE_PEAKS`).
"""

from __future__ import annotations

import contextlib
import gc
import resource
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO, peers, prob, release, reset_peak, rss_mb, synchronize
from transformer.config import register_configs, resolve_n_kv_heads, to_config, validate_config
from transformer.data.collate import Batch
from transformer.data.dataset import ParallelDataset, TranslationData
from transformer.models import build_model
from transformer.models.flops import forward_flops
from transformer.modules.ffn import glu_hidden_size
from transformer.precision import cpu_has_fast_bf16
from transformer.training.distributed.process_group import DistInfo
from transformer.training.job.allocator import tune_cpu_allocator
from transformer.training.loop.trainer import Trainer
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss
from transformer.training.step.optim import build_optimizer

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


def compose_config(overrides: list[str]) -> Any:
    """``configs/train.yaml`` with ``overrides``, composed as Hydra does (nested defaults included),
    validated, as the typed :class:`~transformer.config.Config`."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    validate_config(cfg)
    return to_config(cfg)


def preset(name: str, overrides: list[str] | None = None) -> Any:
    """``(model, optim)`` of ``configs/model/<name>.yaml`` with ``overrides`` (:func:`compose_config`)."""
    cfg = compose_config([f"model={name}", *(overrides or [])])
    return cfg.model, cfg.optim


def dims(cfg: Any) -> dict[str, Any]:
    """The sizes a peer needs to match a preset."""
    hidden = glu_hidden_size(cfg.d_ff, cfg.ffn.multiple_of) if cfg.ffn.glu_match_params else cfg.d_ff
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

    def __init__(self, cfg: Any, fused_loss: bool = True, vocab: int = VOCAB) -> None:
        super().__init__()
        self.model = build_model(cfg, vocab)
        self.arch = cfg.arch
        self.criterion = LabelSmoothedCrossEntropy(LABEL_SMOOTHING, ignore_index=0)
        self.unfused = not fused_loss  # False: the trainer's fused path

    def step_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        net_input = (
            {"src_tokens": batch["src"], "prev_output_tokens": batch["prev"]}
            if self.arch == "encoder_decoder"
            else {"tokens": batch["tokens"]}
        )
        out = model_loss(self.model, self.criterion, net_input, batch["target"], self.model if self.unfused else None)
        return out["loss"] / out["ntokens"]


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def hand_step(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    precision: str = "fp32",
    device: torch.device | None = None,
    loss: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None,
) -> Callable[[], Any]:
    """One step of a model that has no trainer of ours (a peer, or :class:`Ours` alone): zero_grad,
    ``loss(batch)`` (default ``model.step_loss``: a mean over target tokens; a compiled one, say),
    backward, optimizer step; ``precision="bf16"``: the forward and loss under ``torch.autocast``
    (as the trainer does), the backward and the optimizer step in autocast's dtypes."""
    model.train()
    device_type = "cpu" if device is None else device.type
    loss_fn = model.step_loss if loss is None else loss

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        ctx = torch.autocast(device_type, dtype=DTYPES[precision]) if precision != "fp32" else contextlib.nullcontext()
        with ctx:
            value = loss_fn(batch)
        value.backward()
        optimizer.step()

    return step


def time_steps(step: Callable[[], Any], warmup: int, steps: int, device: torch.device | None = None) -> dict[str, Any]:
    """Median and best time (s) of ``steps`` calls of ``step`` after ``warmup``, and the warm-up calls'
    times; each call timed between two ``synchronize(device)`` calls (CUDA's queued work waited for)."""
    device = torch.device("cpu") if device is None else device

    def timed() -> float:
        synchronize(device)
        t = time.perf_counter()
        step()
        synchronize(device)
        return time.perf_counter() - t

    warmup_s = [timed() for _ in range(warmup)]
    gc.collect()
    times = sorted(timed() for _ in range(steps))
    return {"step_s": times[len(times) // 2], "best_s": times[0], "warmup_s": warmup_s}


class VocabSize:
    """A tokenizer of ``size`` entries (``len``: the trainer sizes the embeddings and the output layer
    by it), everything else ``inner``'s (none for a timed update, which reads nothing else of it)."""

    def __init__(self, size: int, inner: Any = None) -> None:
        self.size, self.inner = size, inner

    def __len__(self) -> int:
        """The vocabulary's size."""
        return self.size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__.get("inner"), name)


def as_batch(batch: dict[str, torch.Tensor]) -> Batch:
    """A :func:`make_batch` batch as the trainer's :class:`~transformer.data.collate.Batch`."""
    enc_dec = "src" in batch
    net_input = (
        {"src_tokens": batch["src"], "prev_output_tokens": batch["prev"]} if enc_dec else {"tokens": batch["tokens"]}
    )
    rows = len(batch["target"])
    return Batch(
        net_input,
        batch["target"],
        batch["src"] if enc_dec else batch["tokens"],
        torch.arange(rows),
        int(batch["target"].ne(0).sum()),
        rows,
    )


def make_trainer(
    cfg: Any, data: Any, device: torch.device, parallel_mode: str | None = None, compile_backend: str | None = None
) -> Trainer:
    """A :class:`~transformer.training.loop.trainer.Trainer` for one process on ``device``
    (``parallel_mode="ddp"``: DDP over the one-rank process group that exists; ``compile_backend``:
    the compiled step's ``torch.compile`` backend), its run folder ``cfg.run_dir``, its log lines dropped."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return Trainer(
        cfg,
        data,
        DistInfo(0, 1, device),
        run_dir,
        parallel_mode=parallel_mode,
        log=lambda msg: None,
        compile_backend=compile_backend,
    )


def trainer_under_test(
    spec: dict[str, Any], batch: dict[str, torch.Tensor], device: torch.device, vocab_size: int = VOCAB
) -> Trainer:
    """Our row's :class:`~transformer.training.loop.trainer.Trainer`: the preset with the row's
    overrides, ``train.precision`` and ``train.compile`` (the whole step compiled, with ``backend``
    if the spec names one) of the row, its data the rows of ``batch`` (a ``vocab_size``-entry
    vocabulary); no validation, no checkpoint, its run folder a temporary one, removed with the trainer."""
    arch = "encoder_decoder" if "src" in batch else "decoder_only"
    src = batch["src"] if arch == "encoder_decoder" else batch["tokens"]
    pairs = ParallelDataset(src.tolist(), batch["target"].tolist(), None, None, "train")
    vocab = VocabSize(vocab_size)
    data = TranslationData(vocab, vocab, {"train": pairs, "valid": pairs})
    run_dir = tempfile.mkdtemp(prefix="train_step_")
    cfg = compose_config(
        [f"model={spec['preset']}", *(spec.get("overrides") or [])]
        + [
            f"criterion.label_smoothing={LABEL_SMOOTHING}",
            f"train.precision={spec.get('precision', 'fp32')}",
            f"train.compile={str(bool(spec.get('compile'))).lower()}",
            f"train.device={device.type}",
            "train.validate_every=0",
            "train.save_every=0",
            "train.progress=false",
            f"run_dir={run_dir}",
        ]
    )
    trainer = make_trainer(cfg, data, device, compile_backend=spec.get("backend"))
    weakref.finalize(trainer, shutil.rmtree, run_dir, True)
    return trainer


def peer_model(name: str, cfg: Any, vocab: int = VOCAB) -> torch.nn.Module:
    """Peer ``name`` of ``peers.py`` at the dims of our model config ``cfg`` (its package imported first)."""
    peers.preload(name)
    table = peers.encdec_peers() if cfg.arch == "encoder_decoder" else peers.decoder_only_peers()
    return table[name](dims(cfg), vocab)


def make_optimizer(model: torch.nn.Module, optim_cfg: Any, device_type: str = "cpu") -> torch.optim.Optimizer:
    """Our builder's Adam for every model under test (same implementation for all; fused on CUDA)."""
    return build_optimizer(model, optim_cfg, device_type)


def our_dropout(cfg: Any) -> str:
    """The dropout our model applies (embeddings and residual branches; attention/FFN if set)."""
    extra = [f"{k} {prob(v)}" for k, v in (("attn", cfg.attention_dropout), ("ff", cfg.activation_dropout)) if v]
    return prob(cfg.dropout) + (f" (+ {', '.join(extra)})" if extra else "")


def prime_runtime(optim_cfg: Any) -> None:
    """One tiny forward/backward/optimizer step before a model's baseline RSS is read: building the
    optimizer imports ~800 modules (``torch._dynamo`` and friends, ~70 MiB of RSS) and the first
    backward starts the autograd engine, lazy set-up that is not the model's memory."""
    lin = torch.nn.Linear(16, 16)
    opt = make_optimizer(lin, optim_cfg)
    lin(torch.randn(4, 16)).sum().backward()
    opt.step()


def model_under_test(spec: dict[str, Any]) -> tuple[Any, Any, Callable[[torch.device], tuple[Callable[[], Any], Any]]]:
    """``(model config, optim config, build)`` of one row's ``spec`` (see :func:`worker`);
    ``build(device)`` returns the row's ``(step, model)`` on ``device``: ours, the trainer's update
    (:func:`trainer_under_test`; with ``fused_loss=False`` the ablation, :class:`Ours` unfused under
    :func:`hand_step`); a peer, its step under :func:`hand_step`. A peer's package is imported here
    (``peers.preload``), before the memory baseline."""
    cfg, optim_cfg = preset(spec["preset"], spec.get("overrides"))
    cpu_batch = make_batch(cfg.arch, spec["rows"], spec["src_len"], spec["tgt_len"])
    precision = spec.get("precision", "fp32")
    if spec["model"] != "ours":
        peers.preload(spec["model"])  # module imports are not the model's memory

    def build(device: torch.device) -> tuple[Callable[[], Any], Any]:
        batch = {k: v.to(device) for k, v in cpu_batch.items()}
        torch.manual_seed(0)
        if spec["model"] == "ours" and spec.get("fused_loss", True):
            trainer = trainer_under_test(spec, cpu_batch, device)
            micro = [as_batch(batch)]
            return (lambda: trainer.train_step(micro)), trainer.model
        model = (Ours(cfg, fused_loss=False) if spec["model"] == "ours" else peer_model(spec["model"], cfg)).to(device)
        return hand_step(model, batch, make_optimizer(model, optim_cfg, device.type), precision, device), model

    return cfg, optim_cfg, build


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Build one model in this (fresh) process, time its steps (:func:`time_steps`), measure its memory.

    ``spec``: ``model`` (``"ours"`` or a peer name of ``peers.py``), ``preset``, ``overrides``
    (Hydra), ``compile``, ``fused_loss``, ``rows``, ``src_len``, ``tgt_len``, ``warmup``, ``steps``,
    ``threads``, ``malloc``, ``precision`` (``fp32`` | ``bf16``), ``device`` (``cpu``, the default,
    or ``cuda``). The memory (``mem_mb``, MiB) is on the CPU the process's peak RSS over its RSS before
    the model was built (after one tiny step that starts torch's runtime); on CUDA the peak
    ``torch.cuda.max_memory_allocated`` over what was allocated before (weights, gradients, Adam
    state, activations; the caching allocator's reserve is not counted).
    """
    torch.set_num_threads(spec["threads"])
    tuned = tune_cpu_allocator() if spec["malloc"] == "tuned" else False
    device = torch.device(spec.get("device", "cpu"))
    cuda = device.type == "cuda"
    cfg, optim_cfg, build = model_under_test(spec)
    prime_runtime(optim_cfg)
    gc.collect()
    before = reset_peak(device) if cuda else rss_mb()
    step, model = build(device)
    r = time_steps(step, spec["warmup"], spec["steps"], device)
    if cuda:
        r.update(mem_mb=(torch.cuda.max_memory_allocated(device) - before) / 2**20)
        r["device"] = torch.cuda.get_device_name(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        r.update(mem_mb=peak - before, rss_before_mb=before, peak_rss_mb=peak)
    r.update(
        malloc_tuned=tuned,
        params=sum(p.numel() for p in model.parameters()),
        dropout=our_dropout(cfg) if spec["model"] == "ours" else getattr(model, "dropout_desc", "?"),
    )
    if spec.get("compile"):
        r["compile_s"] = r["warmup_s"][0]  # the first step traces and compiles
    return r


# ----------------------------------------------------------------------------- machine peak


def device_peak(name: str, precision: str) -> float | None:
    """The datasheet peak (FLOP/s) of a GPU named ``name`` (:data:`DEVICE_PEAKS`) at ``precision``
    (``bf16`` | ``fp32``), or None for a GPU the table does not know."""
    for key, peaks in DEVICE_PEAKS.items():
        if key in name:
            return peaks.get(precision)
    return None


def flops_peak(device: torch.device, precision: str, reps: int = 5) -> tuple[float, str]:
    """The peak (FLOP/s) a row's MFU is read against on ``device`` at ``precision`` (``bf16`` |
    ``fp32``), and where it comes from: a GPU's datasheet (:data:`DEVICE_PEAKS`), else the best
    ``torch.mm`` rate measured (``reps`` times a shape, between ``synchronize`` calls, after one
    warm-up): 4096^3 and 8192^3 on a GPU; on a CPU square 1024 / 2048 and the base model's FFN shapes
    (one 2048^3 product alone under-reads the peak on some machine states), a dtype without
    hardware support (bf16 on an AVX2 CPU) on the smaller shapes only."""
    dtype = DTYPES[precision]
    if device.type == "cuda":
        table = device_peak(torch.cuda.get_device_name(device), precision)
        if table:
            return table, "datasheet (DEVICE_PEAKS, dense)"
        shapes, where = [(4096,) * 3, (8192,) * 3], "measured (best torch.mm 4096^3 / 8192^3)"
    else:
        shapes, where = (
            [(1024,) * 3, (2048,) * 3, (1152, 512, 2048), (1152, 2048, 512)],
            "measured (best torch.mm, CPU)",
        )
        if dtype != torch.float32 and not cpu_has_fast_bf16():
            shapes, reps = shapes[::2], 2
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
        torch.mm(a, b)
        for _ in range(reps):
            synchronize(device)
            t = time.perf_counter()
            torch.mm(a, b)
            synchronize(device)
            best = max(best, 2 * m * k * n / (time.perf_counter() - t))
        del a, b
    release(device)
    return best, where
