"""Train-step throughput of our presets against same-dims peers; MFU, memory, KV cache, scaling.

One command (from the repository root; peers come from the ``bench`` extra)::

    python benchmarks/train_throughput.py

prints a Markdown table and writes ``docs/benchmarks/train_throughput.json`` (and ``.md``; ``--out``
elsewhere). Every measured model (table row, scaling point) runs in a fresh subprocess of this file
(``--worker``), so no model inherits the allocator state or the memory high-water mark of another;
a row whose worker fails (a peer package missing, ...) is reported as skipped with the reason.

What is measured (``--threads`` intra-op threads, synthetic uniform tokens, no padding):

* **precision** (``--precision fp32 bf16``): every model at every listed precision, bf16 as
  ``torch.autocast("cpu", bfloat16)`` around the forward and loss for ours and for every peer
  alike (fp32 weights, Adam in fp32). Ratios compare models at the same precision; the
  ``ours bf16 / fp32`` column is our own speed-up. bf16 rows are skipped, with the reason and the
  measured bf16/fp32 matmul peaks, on a CPU without AMX or AVX512-BF16 (there bf16 matmuls are
  emulated, ~100x slower than fp32); ``--force-bf16`` runs them anyway.

* **throughput**: target tokens per second of one training step (zero_grad, forward, loss,
  backward, optimizer step), for the 2017 encoder-decoder (``transformer_tiny``,
  ``transformer_2017_base``) and the Llama-style decoder-only (``llama_style_tiny``,
  ``llama_style``) presets, side by side with ``torch.nn.Transformer``, HF Marian and BART, HF
  Llama and x-transformers at the same dims, batch shape (``B x 24`` target tokens; decoder-only
  rows are ``24`` source + ``24`` target tokens) and vocabulary. Every model gets the same
  optimizer (Adam, the implementation our builder picks). Ratios are peer / ours; median of
  ``--steps`` (``--base-steps``) steps after ``--warmup``.
* **dropout** (a column): HF Llama and the x-transformers decoder have no dropout, so the
  decoder-only ``ours`` row (the one ratios are taken against) runs the preset with
  ``model.dropout=0.0``; ``ours, preset dropout p`` is the preset as shipped. Encoder-decoder rows
  all use the preset's dropout (``torch.nn.Transformer`` also on attention weights and FFN hidden
  units, x-transformers on embeddings and FFN hidden units only).
* **MFU**: ``3 x forward FLOPs`` (``transformer.models.flops.forward_flops``, counting the output
  layer only where a loss is taken) per step over the step time, divided by the matmul peak of the row's dtype
  measured in the same run for the row's dtype (best of square ``torch.mm`` and the FFN shapes).
* **memory**: peak RSS of the model's fresh process (``ru_maxrss``) minus its RSS right before the
  model was built (after the imports, the peer's package included, and one tiny warm-up step that
  starts torch's runtime): weights, gradients, optimizer state, activations and allocator caching.
* **allocator**: ``--malloc tuned`` (default) applies
  ``transformer.training.allocator.tune_cpu_allocator`` (glibc ``mallopt``: freed large tensors
  stay in the heap instead of being unmapped and faulted in again every step) in every worker
  before its model is built; ``--malloc default`` leaves glibc as it is. Same for every model.
* **KV cache**: bytes per generated token for MHA, GQA and MQA at Llama base dims.
* **scaling**: our step time against sequence length (64 ... 1024, fixed 4096 tokens per batch)
  and against batch tokens (fixed length 32), tiny encoder-decoder (``--no-scaling`` to skip).
* **torch.compile**: our tiny rows with ``torch.compile`` on the layers (``--compile``; base rows
  too with ``--compile-base``); the first (compiling) step is reported separately (``compile_s``).
  The ``ours, unfused loss`` rows are the code before the fused output layer + loss (ablation,
  ``--no-ablation`` to skip).
* **decoding**: the rows of a ``benchmarks/decode_speed.py`` results file (``--decode <run>/decode_speed.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from transformer.models import build_model  # noqa: E402
from transformer.models.flops import forward_flops, kv_cache_bytes_per_token  # noqa: E402
from transformer.modules.ffn import glu_hidden_size  # noqa: E402
from transformer.training.allocator import tune_cpu_allocator  # noqa: E402
from transformer.training.criterion import LabelSmoothedCrossEntropy, model_loss  # noqa: E402
from transformer.training.optim import build_optimizer  # noqa: E402
from transformer.training.precision import cpu_has_fast_bf16  # noqa: E402

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
    "H200": {"bf16": 989e12, "fp32": 67e12},
    "H100 PCIe": {"bf16": 756e12, "fp32": 51e12},
    "H100": {"bf16": 989e12, "fp32": 67e12},  # SXM
    "A100": {"bf16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp32": 91.6e12},
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
        "d_model": cfg.d_model, "n_heads": cfg.n_heads, "n_kv_heads": resolve_n_kv_heads(cfg), "d_ff": cfg.d_ff,
        "ffn_hidden": hidden, "enc_layers": cfg.n_encoder_layers, "dec_layers": cfg.n_decoder_layers,
        "dropout": cfg.dropout, "label_smoothing": LABEL_SMOOTHING,
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
    """Our model + criterion, the same calls as ``Trainer._loss``/``train_step``."""

    def __init__(self, cfg: Any, compile_model: bool = False, fused_loss: bool = True) -> None:
        super().__init__()
        self.model = build_model(cfg, VOCAB)
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


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(model: torch.nn.Module, batch: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
               warmup: int, steps: int, precision: str = "fp32", device: torch.device | None = None) -> dict[str, Any]:
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


def _p(x: float) -> str:
    return repr(float(x))


def our_dropout(cfg: Any) -> str:
    """The dropout our model applies (embeddings and residual branches; attention/FFN if set)."""
    extra = [f"{k} {_p(v)}" for k, v in (("attn", cfg.attention_dropout), ("ff", cfg.activation_dropout)) if v]
    return _p(cfg.dropout) + (f" (+ {', '.join(extra)})" if extra else "")


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
        import peers

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
    r.update(mem_mb=(peak - before) / 2**20, params=sum(p.numel() for p in model.parameters()),
             dropout=our_dropout(cfg) if spec["model"] == "ours" else getattr(model, "dropout_desc", "?"),
             device=torch.cuda.get_device_name(device))
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
    r.update(mem_mb=peak - before, rss_before_mb=before, peak_rss_mb=peak, malloc_tuned=tuned,
             params=sum(p.numel() for p in model.parameters()),
             dropout=our_dropout(cfg) if spec["model"] == "ours" else getattr(model, "dropout_desc", "?"))
    if spec.get("compile"):
        r["compile_s"] = r["warmup_s"][0]  # the first step traces and compiles
    return r


def run_one(name: str, spec: dict[str, Any], tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``spec`` in a fresh worker process; a failed worker gives a skipped row with its reason."""
    spec = {**spec, "threads": args.threads, "malloc": args.malloc}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    reason, r = "", None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.worker_timeout)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
            try:
                r = json.loads(lines[-1])
            except json.JSONDecodeError:
                reason = f"unreadable worker output: {lines[-1][:200]}"
        else:
            err = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            reason = err[-1].strip() if err else f"worker exited with {proc.returncode}"
    except subprocess.TimeoutExpired:
        reason = f"worker timed out after {args.worker_timeout} s"
    if r is None:
        print(f"  {name}: skipped ({reason})", flush=True)
        return {"name": name, "skipped": reason, "spec": spec}
    r["tok_s"] = tokens / r["step_s"]
    r["name"] = name
    r["spec"] = spec
    print(f"  {name:<24s} {r['tok_s']:9.0f} tok/s  step {r['step_s'] * 1e3:7.1f} ms  mem +{r['mem_mb']:.0f} MiB", flush=True)
    return r


def run_rounds(specs: list[tuple[str, dict[str, Any]]], tokens: int, args: argparse.Namespace,
               n_rounds: int | None = None) -> list[dict[str, Any]]:
    """Measure every spec ``n_rounds`` (default ``args.rounds``) times, interleaved (round r starts at spec r), one worker each.

    The speed of a shared or throttled machine drifts by up to 2x within minutes; measuring the
    models one after another once each turns that drift into false ratios. Interleaving gives every
    model the same conditions, and the reported step time is the median of its per-round medians
    (``round_step_s`` keeps them all; a best-of estimator picked lucky fast periods in a trial run);
    memory is the largest of its rounds.
    """
    n = len(specs)
    per: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    rounds = args.rounds if n_rounds is None else n_rounds
    for rnd in range(rounds):
        if rounds > 1:
            print(f"  round {rnd + 1}/{rounds}", flush=True)
        for j in range(n):
            i = (rnd + j) % n
            per[i].append(run_one(specs[i][0], specs[i][1], tokens, args))
    out = []
    for (name, _), runs in zip(specs, per):
        ok = [r for r in runs if "tok_s" in r]
        if not ok:
            out.append(runs[0])
            continue
        best = dict(sorted(ok, key=lambda r: r["step_s"])[(len(ok) - 1) // 2])  # the median round
        best["round_step_s"] = [r["step_s"] for r in ok]
        best["mem_mb"] = max(r["mem_mb"] for r in ok)
        if "compile_s" in ok[0]:
            best["compile_s"] = ok[0]["compile_s"]
        out.append(best)
    return out


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


# ----------------------------------------------------------------------------- sections


def bf16_skip_reason(args: argparse.Namespace, peaks: dict[str, float]) -> str:
    """Why bf16 rows are not run on this machine ("" when they are)."""
    if args.force_bf16 or getattr(args, "device", "cpu") == "cuda" or cpu_has_fast_bf16():
        return ""
    return (f"no fast bf16 on this CPU ({cpu_name()}: no AMX / AVX512-BF16, torch capability "
            f"{torch.backends.cpu.get_cpu_capability()}); bf16 matmul {peaks['bf16'] / 1e9:.1f} GFLOP/s vs fp32 "
            f"{peaks['fp32'] / 1e9:.0f}; --force-bf16 runs them anyway")


def throughput(args: argparse.Namespace, peaks: dict[str, float]) -> list[dict[str, Any]]:
    from peers import decoder_only_peers, encdec_peers

    rows_out = []
    several = len(args.precision) > 1
    skip_bf16 = bf16_skip_reason(args, peaks) if "bf16" in args.precision else ""
    device = getattr(args, "device", "cpu")
    for size in args.sizes:
        ed_name, do_name, rows = SIZES[size]
        if device == "cuda":
            rows = args.cuda_rows
        for family, preset_name, peers in (
            ("encoder-decoder", ed_name, encdec_peers()), ("decoder-only", do_name, decoder_only_peers()),
        ):
            size_over = PRESET_OVERRIDES.get((size, family), [])
            cfg, _ = preset(preset_name, size_over)
            tokens = rows * TGT_LEN
            flops = train_flops(cfg, rows, SRC_LEN, TGT_LEN)
            print(f"[{size} {family}] {preset_name}, batch {rows}x{TGT_LEN}, {flops / rows / TGT_LEN / 1e6:.1f} "
                  "MFLOP per target token", flush=True)
            w, s = args.warmup, (args.steps if size == "tiny" else args.base_steps)
            specs, skipped = [], []
            for prec in args.precision:
                tag = f" [{prec}]" if several else ""
                base = {"preset": preset_name, "rows": rows, "src_len": SRC_LEN, "tgt_len": TGT_LEN,
                        "warmup": w, "steps": s, "precision": prec, "device": device, "overrides": size_over}
                # decoder-only peers have no dropout: our reference row gets none either
                ours_over = size_over + (["model.dropout=0.0"] if family == "decoder-only" else [])
                ours_spec = {**base, "model": "ours", "overrides": ours_over}
                these = [("ours" + tag, ours_spec)]
                if family == "decoder-only":
                    these.append((f"ours, preset dropout {_p(cfg.dropout)}{tag}", {**base, "model": "ours"}))
                if not args.no_ablation:  # before the fused output layer + loss: full logits, then the loss
                    these.append(("ours, unfused loss" + tag, {**ours_spec, "fused_loss": False}))
                if (args.compile or args.compile_base) and (size == "tiny" or args.compile_base):
                    these.append(("ours + torch.compile" + tag, {**ours_spec, "compile": True, "warmup": max(w, 3)}))
                if not args.no_peers:
                    these += [(pname + tag, {**base, "model": pname}) for pname in peers]
                if prec == "bf16" and skip_bf16:
                    skipped += [{"name": n, "skipped": skip_bf16, "spec": sp} for n, sp in these]
                else:
                    specs += these
            results = run_rounds(specs, tokens, args, args.rounds if size == "tiny" else args.base_rounds)
            ours = {r["spec"]["precision"]: r for r in results if r["spec"]["model"] == "ours"
                    and r["name"].split(" [")[0] == "ours"}
            for r in results:
                prec = r["spec"]["precision"]
                r["precision"] = prec
                if "tok_s" not in r:
                    continue
                r["mfu"] = flops / r["step_s"] / peaks[prec]
                if "tok_s" in ours.get(prec, {}):
                    r["ratio_to_ours"] = r["tok_s"] / ours[prec]["tok_s"]
                if prec != "fp32" and r["spec"]["model"] == "ours" and "tok_s" in ours.get("fp32", {}):
                    r["speedup_vs_ours_fp32"] = r["tok_s"] / ours["fp32"]["tok_s"]
            for r in skipped:
                r["precision"] = r["spec"]["precision"]
            rows_out.append({"size": size, "family": family, "preset": preset_name, "batch": [rows, TGT_LEN],
                             "train_flops_per_step": flops, "results": results + skipped})
    return rows_out


def kv_cache() -> list[dict[str, Any]]:
    out = []
    for attn in ("mha", "gqa", "mqa"):
        cfg, _ = preset("llama_style", [f"model/attention={attn}"])
        from transformer.config import resolve_n_kv_heads

        out.append({"attention": attn, "n_heads": cfg.n_heads, "n_kv_heads": resolve_n_kv_heads(cfg),
                    "bytes_per_token": kv_cache_bytes_per_token(cfg)})
    mha = out[0]["bytes_per_token"]
    for r in out:
        r["ratio_to_mha"] = r["bytes_per_token"] / mha
        assert abs(r["ratio_to_mha"] - r["n_kv_heads"] / r["n_heads"]) < 1e-12
    return out


def scaling(args: argparse.Namespace, peak: float) -> dict[str, list[dict[str, Any]]]:
    name = "transformer_tiny"
    cfg, _ = preset(name)
    out: dict[str, list[dict[str, Any]]] = {"seq_len": [], "batch_tokens": []}
    points = [("seq_len", length, max(1, args.scaling_tokens // length)) for length in args.scaling_lengths]
    points += [("batch_tokens", 32, rows) for rows in args.scaling_rows]
    for key, length, rows in points:
        label = f"len {length} x {rows} rows" if key == "seq_len" else f"{rows} rows x len 32"
        spec = {"model": "ours", "preset": name, "rows": rows, "src_len": length, "tgt_len": length, "warmup": 1,
                "steps": args.scaling_steps, "device": getattr(args, "device", "cpu")}
        r = run_one(label, spec, rows * length, args)
        r.update(seq_len=length, rows=rows, batch_tokens=rows * length)
        if "step_s" in r:
            r["mfu"] = train_flops(cfg, rows, length, length) / r["step_s"] / peak
        out[key].append(r)
    return out


def decode_rows(path: Path) -> dict[str, Any]:
    """The rows of a ``benchmarks/decode_speed.py`` results file (``<run>/decode_speed.json``).

    Decoding needs a trained checkpoint, so it is run on its own (see that script) and its JSON
    is folded into this table with ``--decode PATH``.
    """
    data = json.loads(Path(path).read_text())
    ours = {r["strategy"]: r for r in data["results"] if r["system"] == "ours"}
    rows = []
    for r in data["results"]:
        base = ours.get(r["strategy"])
        rows.append({
            "system": r["system"], "strategy": r["strategy"], "beam": r["beam"], "sentences": r["sentences"],
            "sentences_per_s": r["sentences_per_s"], "tokens_per_s": r["tokens_per_s"],
            "ratio_to_ours": r["sentences_per_s"] / base["sentences_per_s"] if base else None,
            "peak_mb": r["peak_mb"], "bleu": r["bleu"], "same_as_ours": r.get("same_as_ours"),
        })
    return {"file": str(path), "run": data["args"]["run"], "split": data["args"]["split"],
            "threads": data["args"]["threads"], "device": data["args"]["device"], "rows": rows}


# ----------------------------------------------------------------------------- report


def _skip_cell(r: dict[str, Any]) -> str:
    reason = r["skipped"].replace("|", "/")
    return f"skipped ({reason[:100]})"


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    malloc = ("tuned for every model (`transformer.training.allocator.tune_cpu_allocator`: glibc `mallopt` "
              "mmap and trim thresholds raised)" if m["malloc"] == "tuned" else "default for every model")
    rows = [r for block in res["throughput"] for r in block["results"]]
    rows += [r for part in (res.get("scaling") or {}).values() for r in part]
    untuned = [r["name"] for r in rows if m["malloc"] == "tuned" and "malloc_tuned" in r and not r["malloc_tuned"]]
    if untuned:
        malloc += f" (mallopt unavailable in the workers of: {', '.join(untuned)})"
    lines = [
        "# Train-step throughput against peers",
        "",
        f"Command: `{res['command']}`  ",
        f"Date: {res['date']}; commit `{res['commit']}`  ",
        f"Machine: {m['cpu']}, {m['threads']} torch threads, torch {m['torch']}"
        + (f"; **GPU: {m['gpu']}** (every row on the GPU; peaks: datasheet, else a matmul probe)" if m.get("gpu") else "") + "; "
        "Matmul peak measured in this run (best `torch.mm` over square and FFN shapes), at the start / at the end: "
        + "; ".join(f"{prec} **{m['peaks_gflops'][prec]:.1f}** / {m.get('peaks_gflops_end', {}).get(prec, float('nan')):.1f} GFLOP/s"
                    for prec in m["peaks_gflops"])
        + "; MFU uses the higher of the row's dtype. "
        f"Step times: median over {res.get('rounds', 1)} (tiny) / {res.get('base_rounds', 1)} (base) interleaved rounds per model "
        "of the median step of each round.  ",
        f"glibc malloc: {malloc}.",
        "",
        "Target tokens/s of a full training step (forward, loss, backward, Adam step) at the row's precision "
        "(bf16 = `torch.autocast(\"cpu\", bfloat16)` around forward and loss for every model), vocabulary "
        f"{VOCAB}, uniform random tokens without padding; each model in a fresh process; ratio = peer / ours at the "
        "same precision; bf16/fp32 = ours in bf16 over ours in fp32; "
        "MFU = 3 x forward FLOPs (output layer at loss positions only) / step time / measured peak. "
        "Memory = peak RSS of a fresh process per model minus its RSS before the model was built (weights, "
        "grads, optimizer state, activations, allocator caching).",
        "",
        "Dropout: HF Llama and x-transformers (decoder-only) run without dropout, so the decoder-only `ours` row "
        "(the one the ratios are against) runs the preset with `model.dropout=0.0`; the `ours, preset dropout` "
        "row is the preset as shipped. Encoder-decoder rows all use the preset's dropout: ours, Marian and BART "
        "on embeddings and residual branches; nn.Transformer also on attention weights and FFN hidden units; "
        "x-transformers on embeddings and FFN hidden units only.",
        "",
        "| size | family | model | precision | dropout | target tok/s | ratio to ours | bf16/fp32 | MFU | step ms | memory MiB |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    compiled = []
    bf16_skips = {r["skipped"] for block in res["throughput"] for r in block["results"]
                  if r.get("precision") == "bf16" and r.get("skipped", "").startswith("no fast bf16")}
    for block in res["throughput"]:
        size = f"{block['size']} ({block['batch'][0]}x{block['batch'][1]})"
        for r in block["results"]:
            prec = r.get("precision", "fp32")
            if r.get("skipped") in bf16_skips:
                continue  # one sentence under the table
            if "tok_s" not in r:
                lines.append(f"| {size} | {block['family']} | {r['name']} | {prec} | | {_skip_cell(r)} | | | | | |")
                continue
            ratio = f"{r['ratio_to_ours']:.2f}" if "ratio_to_ours" in r else ""
            speedup = f"{r['speedup_vs_ours_fp32']:.2f}" if "speedup_vs_ours_fp32" in r else ""
            lines.append(
                f"| {size} | {block['family']} | {r['name']} | {prec} | {r['dropout']} | "
                f"{r['tok_s']:,.0f} | {ratio} | {speedup} | {100 * r['mfu']:.0f}% | {1e3 * r['step_s']:.0f} | "
                f"{r['mem_mb']:.0f} |"
            )
            if "compile_s" in r:
                compiled.append(f"{block['size']} {block['family']} {r['compile_s']:.1f} s")
    if compiled:
        lines += ["", "torch.compile rows: first (compiling) step, not in the step time: " + "; ".join(compiled) + "."]
    for reason in sorted(bf16_skips):
        lines += ["", f"bf16 rows not run: {reason}."]
    lines += ["", "## KV cache per generated token (Llama-style base, fp32, all layers)", "",
              "| attention | n_heads | n_kv_heads | bytes/token | ratio to MHA |", "|---|---:|---:|---:|---:|"]
    for r in res["kv_cache"]:
        lines.append(f"| {r['attention']} | {r['n_heads']} | {r['n_kv_heads']} | {r['bytes_per_token']:,} | "
                     f"{r['ratio_to_mha']:.3f} |")
    if res.get("scaling"):
        for key, head in (("seq_len", "sequence length"), ("batch_tokens", "batch tokens (len 32)")):
            if key == "seq_len":
                lines += ["", "## Scaling (ours, tiny encoder-decoder, one process per point)"]
            lines += ["", f"| {head} | rows | tokens/s | step ms | MFU | memory MiB |",
                      "|---:|---:|---:|---:|---:|---:|"]
            for r in res["scaling"][key]:
                if "tok_s" not in r:
                    lines.append(f"| {r[key]} | {r['rows']} | {_skip_cell(r)} | | | |")
                    continue
                lines.append(f"| {r[key]} | {r['rows']} | {r['tok_s']:,.0f} | {1e3 * r['step_s']:.0f} | "
                             f"{100 * r['mfu']:.0f}% | {r['mem_mb']:.0f} |")
    if res.get("decode"):
        d = res["decode"]
        lines += ["", f"## Decoding ({d['split']}, {d['device']}, {d['threads']} threads; from `{d['file']}`)", "",
                  "Same checkpoint in both systems (ours copied into a same-size HF Marian); ratio = system / ours.", "",
                  "| system | search | sentences/s | target tok/s | ratio to ours | peak MiB | BLEU | same output as ours |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in d["rows"]:
            ratio = "" if r["ratio_to_ours"] is None else f"{r['ratio_to_ours']:.2f}"
            same = "" if r["same_as_ours"] is None else f"{100 * r['same_as_ours']:.1f}%"
            search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            lines.append(f"| {r['system']} | {search} | {r['sentences_per_s']:.1f} | {r['tokens_per_s']:,.0f} | {ratio} | "
                         f"{r['peak_mb']:.0f} | {r['bleu']:.2f} | {same} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["tiny", "base"], choices=list(SIZES))
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES),
                   help="precisions to measure every model at (bf16: autocast for ours and peers alike)")
    p.add_argument("--force-bf16", action="store_true",
                   help="run bf16 rows even on a CPU without AMX / AVX512-BF16 (emulated, very slow)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: every row on the GPU (one fresh process each, torch.cuda.max_memory_allocated; "
                        "MFU against the datasheet peak of DEVICE_PEAKS, or a matmul probe for an unknown GPU)")
    p.add_argument("--cuda-rows", type=int, default=256, help="batch rows of every size on CUDA (x 24 target tokens)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="measured steps at tiny size (median reported)")
    p.add_argument("--base-steps", type=int, default=3, help="measured steps at base size")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--compile", action="store_true", help="add tiny rows with torch.compile on")
    p.add_argument("--compile-base", action="store_true", help="torch.compile rows at base size too")
    p.add_argument("--malloc", choices=["tuned", "default"], default="tuned",
                   help="glibc malloc in every worker: tune_cpu_allocator() (default) or as it is")
    p.add_argument("--worker-timeout", type=float, default=3600, help="seconds before a model's process is given up")
    p.add_argument("--no-ablation", action="store_true", help="leave out the 'ours, unfused loss' row")
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--scaling-lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--scaling-tokens", type=int, default=4096)
    p.add_argument("--scaling-rows", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--scaling-steps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="interleaved measurements per model at tiny size (median round reported)")
    p.add_argument("--base-rounds", type=int, default=3, help="interleaved measurements per model at base size")
    p.add_argument("--decode", type=Path, default=None, metavar="JSON",
                   help="fold in a benchmarks/decode_speed.py results file (<run>/decode_speed.json)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "train_throughput.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one model in this process (a JSON spec)
    args = p.parse_args()

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    torch.set_num_threads(args.threads)
    start = time.time()
    precs = ("fp32", *[p for p in args.precision if p != "fp32"])
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else None

    def probe() -> dict[str, float]:
        if gpu is None:
            return {prec: matmul_peak(dtype=DTYPES[prec]) for prec in precs}
        dev = torch.device("cuda", 0)
        return {prec: device_peak(gpu, prec) or cuda_matmul_peak(dev, DTYPES[prec]) for prec in precs}

    peaks = probe()
    for prec, value in peaks.items():
        print(f"{prec} matmul peak: {value / 1e9:.1f} GFLOP/s ({gpu or f'{args.threads} threads'})", flush=True)
    peak = peaks["fp32"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    res: dict[str, Any] = {
        "command": "python benchmarks/train_throughput.py " + " ".join(sys.argv[1:]),
        "rounds": args.rounds,
        "base_rounds": args.base_rounds,
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "precision": args.precision,
        "machine": {"cpu": cpu_name(), "gpu": gpu, "device": args.device, "threads": args.threads, "torch": torch.__version__,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_fast_bf16": cpu_has_fast_bf16(),
                    "peaks_gflops": {k: v / 1e9 for k, v in peaks.items()}, "peak_gflops": peak / 1e9,
                    "malloc": args.malloc, "process_per_model": True},
    }
    res["throughput"] = throughput(args, peaks)
    res["kv_cache"] = kv_cache()
    if not args.no_scaling:
        res["scaling"] = scaling(args, peak)
    if args.decode:
        res["decode"] = decode_rows(args.decode)
    peaks_end = probe()
    res["machine"]["peaks_gflops_end"] = {k: v / 1e9 for k, v in peaks_end.items()}
    res["machine"]["peak_gflops_end"] = peaks_end["fp32"] / 1e9
    # MFU against the higher probe: the machine's speed drifts and the rows report their best round
    best = {prec: max(peaks[prec], peaks_end[prec]) for prec in peaks}
    res["machine"]["mfu_peak_gflops"] = best["fp32"] / 1e9
    rows = [r for block in res["throughput"] for r in block["results"]]
    rows += [r for part in (res.get("scaling") or {}).values() for r in part]
    for r in rows:
        if "mfu" in r:
            prec = r.get("precision", "fp32")
            r["mfu"] *= peaks[prec] / best[prec]
    res["seconds"] = time.time() - start
    md = markdown(res)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    args.out.with_suffix(".md").write_text(md)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')} in {res['seconds']:.0f} s")


if __name__ == "__main__":
    main()
