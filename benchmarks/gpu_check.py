"""The GPU path of the project, checked and recorded in one command (issue #21 item 5).

    python benchmarks/gpu_check.py --device cuda                 # on a GPU machine: < 8 minutes
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu_check   # smoke run on a CPU

``scripts/gpu_check.sh`` runs this and then ``scripts/results_gpu.sh`` under one time cap (the one
prepared command for a GPU machine). Results go to ``--out`` (default ``docs/benchmarks/gpu/`` with
``--device cuda``, ``runs/gpu_check_cpu/`` with ``--device cpu``, so a CPU run never overwrites GPU
results): ``gpu_check.json`` and ``gpu_check.md``, both rewritten after every section and inside the
long ones after every run or row, so a crash or a time cap part way leaves what was done on disk
(a section cut off is marked ``running``). Every file names the device. Checkpoints, the CPU smoke
corpus and its data cache go to ``--work`` (default ``runs/gpu_check_work/``), never to ``--out``; on
the GPU, Multi30k is binarized into the project's default data cache, where ``results_gpu.sh`` finds it.

Sections (each one wrapped: a failing section is recorded as ``failed`` with its error or the
checks that did not hold, and the others still run; ``--skip NAME`` records one as ``skipped``):

* ``environment``: device name and capability, torch / CUDA / cuDNN / triton / transformers
  versions, TF32 and SDPA backend flags, CPU, the data folder; what is missing is said here.
* ``training``: the project's own loop (:meth:`transformer.training.trainer.Trainer.fit`, the loop
  behind ``scripts/train.py``) on Multi30k en-de with ``transformer_tiny`` (dropout 0, so that the
  CPU and the GPU draw no random numbers), ``train.precision`` fp32 and bf16 with ``train.compile``
  off: losses finite and falling; the first update's loss against the same config's first update on
  the CPU, computed in this process (relative tolerance fp32 1e-4, bf16 1e-2; a CPU without fast
  bf16 gives the bf16 run the fp32 CPU reference); training tokens/s (the trainer's own count) and
  peak memory. The fp32 run trains longer (``--decode-updates``): it is the model the decoding
  section translates with.
* ``decoding``: greedy and beam 5 on the first 50 test sentences (test_2016_flickr) with that model
  in fp32, on the device and on a CPU copy: the number of equal hypotheses and the first differing
  lines with their scores.
* ``sdpa``: which ``scaled_dot_product_attention`` kernel ran (torch.profiler's aten op under each
  call: flash, memory-efficient, cuDNN, math; the CUDA kernel names too) for the encoder-decoder
  and the decoder-only family, training forward (fp32 and bf16) and decoding (greedy and beam),
  per attention role (encoder self, decoder self, cross); then each call's arguments replayed with
  one backend allowed at a time (``torch.nn.attention.sdpa_kernel``), which gives the eligible
  backends and torch's own reason for each one that is not (e.g. flash takes no ``attn_mask``).
* ``throughput``: ``benchmarks/train_throughput.py``'s machinery (same models, batches, FLOP count,
  optimizer) in this process at tiny, small and base sizes, ours beside HF Marian / HF Llama at the
  same dims, fp32 and bf16 autocast: target tokens/s (median step), MFU against the device's dense
  bf16 peak (H200: 989 TFLOP/s; :data:`train_throughput.DEVICE_PEAKS`, else a matmul probe) and
  against the row's dtype peak, peak memory (``torch.cuda.max_memory_allocated``).
* ``training_compile``: the training check with ``train.compile=true`` (fp32 and bf16), last because
  compiling is the slowest and least predictable part; the first update's time includes the first
  compile (a later batch shape recompiles once, with dynamic shapes).

The whole check keeps to ``--budget-s`` (GPU default 390 s): a run or row that would start past it
is recorded as skipped for the time budget. SIGTERM (``timeout``) records the section in progress
as failed and stops.

``--study-summary RUNS_DIR`` (used by ``scripts/gpu_check.sh``) instead summarises the run folders
of a ``scripts/results_gpu.sh`` study (updates reached, tokens/s, BLEU) into ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gzip
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

REQUIRED = {  # module: distribution (what pip install -e . brings)
    "torch": "torch", "numpy": "numpy", "hydra": "hydra-core", "omegaconf": "omegaconf", "einops": "einops",
    "sentencepiece": "sentencepiece", "sacrebleu": "sacrebleu", "safetensors": "safetensors", "tqdm": "tqdm",
}
OPTIONAL = {  # module: what is lost without it
    "transformers": "the HF Marian / HF Llama rows of the throughput section",
    "triton": "torch.compile on CUDA (inductor's GPU kernels): the training_compile section",
    "matplotlib": "scripts/compare.py's plots in the study (the tables are still written)",
}
SECTIONS = ("environment", "training", "decoding", "sdpa", "throughput", "training_compile")


def missing_packages() -> list[str]:
    """``module (distribution)`` for every required module that cannot be imported here."""
    return [f"{m} ({d})" for m, d in REQUIRED.items() if importlib.util.find_spec(m) is None]


if __name__ == "__main__" and missing_packages() and "--study-summary" not in sys.argv:
    print("gpu_check: missing packages: " + ", ".join(missing_packages()) + f" (python {sys.executable}); "
          "install the project first: pip install -e . (and transformers for the HF rows)", file=sys.stderr)
    sys.exit(2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from train_throughput import (  # noqa: E402
    PRESET_OVERRIDES, SIZES, SRC_LEN, TGT_LEN, cuda_matmul_peak, device_peak, make_optimizer, matmul_peak,
    measure_on_cuda, model_under_test, our_dropout, preset, time_steps, train_flops,
)
from transformer.config import GenerationConfig, register_configs, to_config, validate_config  # noqa: E402
from transformer.data.dataset import load_translation_data  # noqa: E402
from transformer.generation import translate_sentences  # noqa: E402
from transformer.modules.attention import Attention, MultiHeadLatentAttention  # noqa: E402
from transformer.training.distributed import DistInfo  # noqa: E402
from transformer.training.precision import cpu_has_fast_bf16, cpu_model_name, describe_hardware  # noqa: E402
from transformer.training.trainer import Trainer  # noqa: E402

# ----------------------------------------------------------------------------- the report


class Stopped(Exception):
    """SIGTERM arrived (a time cap): the section in progress is recorded, the rest do not run."""


class OutOfTime(Exception):
    """The next piece of work would start past ``--budget-s``."""


class Budget:
    """Seconds left of ``--budget-s`` (0 = no limit)."""

    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.time(), seconds

    def left(self) -> float:
        """Seconds left (infinite without a budget)."""
        return math.inf if self.seconds <= 0 else self.seconds - (time.time() - self.start)

    def need(self, seconds: float, what: str) -> None:
        """Raise :class:`OutOfTime` when fewer than ``seconds`` are left for ``what``."""
        if self.left() < seconds:
            raise OutOfTime(f"{what}: skipped, {max(self.left(), 0):.0f} s of the {self.seconds:.0f} s budget "
                            f"left, ~{seconds:.0f} s needed")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class Report:
    """``gpu_check.json`` + ``gpu_check.md`` in ``out``, rewritten whenever a section changes."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"meta": meta, "sections": {}}

    def write(self) -> None:
        """Write both files (atomically: a reader never sees half a file)."""
        self.data["meta"]["written"] = datetime.datetime.now().isoformat(timespec="seconds")
        _atomic_write(self.out / "gpu_check.json", json.dumps(self.data, indent=1, default=str) + "\n")
        _atomic_write(self.out / "gpu_check.md", markdown(self.data))

    def start(self, name: str) -> dict[str, Any]:
        """A new section record, status ``running`` (what a killed process leaves)."""
        sec = {"status": "running", "started": datetime.datetime.now().isoformat(timespec="seconds"),
               "checks": [], "results": {}, "notes": []}
        self.data["sections"][name] = sec
        self.write()
        return sec

    def skip(self, name: str, reason: str) -> None:
        """Record ``name`` as skipped with ``reason``."""
        self.data["sections"][name] = {"status": "skipped", "reason": reason, "checks": [], "results": {}, "notes": []}
        self.write()

    def run(self, name: str, fn: Callable[[dict[str, Any]], None]) -> None:
        """Run section ``fn(sec)``; it fills ``sec["results"]`` / ``sec["checks"]`` and may call
        :meth:`write` as it goes. Status: ``passed`` (every check held), ``failed`` (a check did
        not hold, or it raised: ``error`` and ``traceback``)."""
        sec = self.start(name)
        t = time.time()
        try:
            fn(sec)
            bad = [c["name"] for c in sec["checks"] if not c["passed"]]
            sec["status"] = "failed" if bad else "passed"
            if bad:
                sec["error"] = "checks that did not hold: " + "; ".join(bad)
        except Stopped as err:
            sec.update(status="failed", error=str(err))
            raise
        except Exception as err:  # one section failing must not stop the others
            sec.update(status="failed", error=f"{type(err).__name__}: {err}",
                       traceback=traceback.format_exc(limit=12)[-4000:])
            print(f"[{name}] failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        finally:
            sec["seconds"] = round(time.time() - t, 1)
            self.write()
        print(f"[{name}] {sec['status']} in {sec['seconds']:.0f} s", file=sys.stderr, flush=True)


def check(sec: dict[str, Any], name: str, passed: bool, detail: str = "") -> bool:
    """Append one named check to a section."""
    sec["checks"].append({"name": name, "passed": bool(passed), "detail": detail})
    return bool(passed)


# ----------------------------------------------------------------------------- environment


def git_commit() -> str:
    """The short commit of the working tree ('+ local changes' when it differs), or '?'."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (commit or "?") + (" + local changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def find_data_dir() -> Path | None:
    """The folder holding ``multi30k/train.en.gz``: ``$TRANSFORMER_DATA_DIR``, ``<repo>/shared/data``
    or ``<repo>/../shared/data``, the first that has it."""
    candidates = [os.environ.get("TRANSFORMER_DATA_DIR"), REPO / "shared" / "data", REPO.parent / "shared" / "data"]
    for c in candidates:
        if c and (Path(c) / "multi30k" / "train.en.gz").is_file():
            return Path(c).resolve()
    return None


def device_description(device: torch.device) -> dict[str, Any]:
    """What the results are from: the device's name (the GPU's, or the CPU's), memory, capability."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"device": "cuda", "device_name": torch.cuda.get_device_name(device),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
                "memory_gib": round(props.total_memory / 2**30, 1), "multiprocessors": props.multi_processor_count}
    return {"device": "cpu", "device_name": cpu_model_name()}


def section_environment(sec: dict[str, Any], ctx: "Context") -> None:
    """Versions, flags and what is missing."""
    r = sec["results"]
    r.update(device_description(ctx.device))
    hw = describe_hardware()
    r.update(torch=hw["torch"], cuda=torch.version.cuda, python=platform.python_version(), cpu=hw["cpu"],
             cpu_count=hw["cpu_count"], torch_threads=hw["torch_threads"], cuda_available=torch.cuda.is_available(),
             transformers=version("transformers"), triton=version("triton") or version("pytorch-triton"),
             data_dir=str(ctx.data_dir) if ctx.data_dir else None, commit=git_commit())
    missing_opt = [f"{m} ({why})" for m, why in OPTIONAL.items() if importlib.util.find_spec(m) is None
                   and (m != "triton" or ctx.device.type == "cuda")]
    r["missing_optional"] = missing_opt
    if ctx.device.type == "cuda":
        r.update(cudnn=torch.backends.cudnn.version(), gpu_count=torch.cuda.device_count(),
                 matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                 cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                 float32_matmul_precision=torch.get_float32_matmul_precision(),
                 sdpa_enabled={"flash": torch.backends.cuda.flash_sdp_enabled(),
                               "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                               "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                               "math": torch.backends.cuda.math_sdp_enabled()},
                 peak_table_bf16=device_peak(r["device_name"], "bf16"))
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            r["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.SubprocessError) as err:
            r["nvidia_smi"] = f"not run: {err}"
    for m in missing_opt:
        sec["notes"].append(f"missing (optional): {m}")
    if ctx.data_dir is None:
        sec["notes"].append("no Multi30k found ($TRANSFORMER_DATA_DIR, <repo>/shared/data, <repo>/../shared/data): "
                            "the training, decoding and sdpa sections fail; copy the data folder next to the repo")
    check(sec, "device usable", ctx.device.type == "cpu" or torch.cuda.is_available(),
          f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}")
    check(sec, "Multi30k found", ctx.data_dir is not None, str(ctx.data_dir))


# ----------------------------------------------------------------------------- configs, data, runs


QUICK_SLICE = {"train": 600, "val": 40, "test_2016_flickr": 60}
QUICK_MODEL = ["model.n_encoder_layers=2", "model.n_decoder_layers=2", "model.d_model=32", "model.n_heads=4",
               "model.d_ff=64"]


@dataclasses.dataclass
class Context:
    """What the sections share: arguments, device, data, the CPU references, the trained model."""

    args: argparse.Namespace
    device: torch.device
    budget: Budget
    data_dir: Path | None
    work: Path
    data: Any = None
    cpu_refs: dict[str, Any] = dataclasses.field(default_factory=dict)
    decode_trainer: Any = None
    runs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    meta_device: str = ""  # the device's name, written into every record


def slice_corpus(data_dir: Path, root: Path) -> Path:
    """The first lines of Multi30k en-de train/val/test as plain ``{split}.{lang}`` files (the CPU smoke corpus)."""
    root.mkdir(parents=True, exist_ok=True)
    for split, n in QUICK_SLICE.items():
        for lang in ("en", "de"):
            if (root / f"{split}.{lang}").is_file():
                continue
            with gzip.open(data_dir / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (root / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return root


def data_overrides(ctx: Context) -> list[str]:
    """The ``data`` part of every run's config: Multi30k en-de (a slice of it with ``--quick``)."""
    if ctx.data_dir is None:
        raise RuntimeError("no Multi30k data (set TRANSFORMER_DATA_DIR to the folder holding multi30k/)")
    cache = ctx.work / "cache"
    if ctx.args.quick:
        corpus = slice_corpus(ctx.data_dir, ctx.work / "corpus")
        return ["data=parallel_text", f"data.root={corpus}", "data.src_lang=en", "data.tgt_lang=de",
                "data.train_prefix=train", "data.valid_prefix=val", "data.test_prefix=test_2016_flickr",
                "data.test_splits=[test_2016_flickr]", "data.vocab_size=300", f"data.cache_dir={cache}"]
    # the default data cache (keyed by the training files' contents): results_gpu.sh's preprocessing
    # of multi30k_en_de after the check then finds it built
    return ["data=multi30k_en_de", f"data.root={ctx.data_dir}", "data.test_splits=[test_2016_flickr]"]


def model_overrides(ctx: Context, family: str) -> list[str]:
    """``transformer_tiny`` / ``llama_style_tiny`` (2 layers of width 32 with ``--quick``), dropout 0."""
    if family == "encoder-decoder":
        over = ["model=transformer_tiny"] + (QUICK_MODEL if ctx.args.quick else [])
    else:
        over = ["model=llama_style_tiny"] + (
            ["model.n_decoder_layers=2", "model.d_model=32", "model.n_heads=4", "model.d_ff=64"] if ctx.args.quick else [])
    return over + ["model.dropout=0.0"]


def compose_config(overrides: list[str]) -> Any:
    """``configs/train.yaml`` with ``overrides``, validated, as the typed :class:`~transformer.config.Config`."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    validate_config(cfg)
    return to_config(cfg)


def run_config(ctx: Context, name: str, family: str, precision: str, compile_on: bool, updates: int,
               device: str) -> Any:
    """One training run's config: the family's model, Multi30k, ``updates`` updates, no validation
    until the end, no BLEU, every update logged, run folder ``<work>/runs/<name>``."""
    q = ctx.args.quick
    over = model_overrides(ctx, family) + data_overrides(ctx) + [
        f"train.max_tokens={600 if q else 4096}", f"train.max_updates={updates}", "train.max_time=0",
        "train.validate_every=0", "train.valid_bleu=false", "train.log_every=1", "train.progress=false",
        "train.save_every=0", f"train.precision={precision}", f"train.compile={str(compile_on).lower()}",
        f"train.device={device}", f"optim.lr={3e-3 if q else 5e-3}", f"lr_scheduler.warmup_updates={4 if q else 100}",
        "seed=1", f"run_dir={ctx.work / 'runs' / name}",
    ]
    return compose_config(over)


def load_data(ctx: Context) -> Any:
    """The corpus (tokenizers and binarized splits), loaded once."""
    if ctx.data is None:
        cfg = run_config(ctx, "data", "encoder-decoder", "fp32", False, 1, "cpu")
        ctx.data = load_translation_data(cfg.data, log=None)
    return ctx.data


class Collect:
    """The metrics sink :meth:`Trainer.fit` logs to (the ``MetricsLogger`` interface), in memory."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def log(self, metrics: dict[str, Any], step: int, split: str) -> None:
        """Keep the numbers of one record."""
        self.rows.append({"split": split, "update": step,
                          **{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}})

    def close(self) -> None:
        """Nothing to release."""


def make_trainer(cfg: Any, data: Any, device: torch.device) -> Any:
    """A :class:`~transformer.training.trainer.Trainer` for one process on ``device``."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, data, DistInfo(0, 1, device), run_dir)
    trainer.log = lambda msg: None
    return trainer


def fit_run(ctx: Context, cfg: Any) -> tuple[Any, dict[str, Any]]:
    """Train ``cfg`` with :meth:`Trainer.fit` on ``ctx.device``; the losses, speed and memory."""
    data = load_data(ctx)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
    trainer = make_trainer(cfg, data, ctx.device)
    sink = Collect()
    t = time.time()
    stop = trainer.fit(sink)
    wall = time.time() - t
    train_rows = [r for r in sink.rows if r["split"] == "train"]
    rates = [r["tokens_per_s"] for r in train_rows if "tokens_per_s" in r]
    first_s = train_rows[0]["ntokens"] / train_rows[0]["tokens_per_s"] if rates else None
    later = rates[len(rates) // 2:] or rates
    out = {
        "updates": trainer.update, "stop": stop, "precision": trainer.precision, "compile": cfg.train.compile,
        "losses": [r["loss"] for r in train_rows], "ntokens": [int(r["ntokens"]) for r in train_rows],
        "valid_loss": next((r["loss"] for r in sink.rows if r["split"] == "valid"), None),
        "wall_s": wall, "first_update_s": first_s,
        "tokens_per_s_median_2nd_half": statistics.median(later) if later else None,
        "tokens_per_s_overall": trainer.train_tokens / max(trainer.train_time, 1e-9),
        "peak_memory_mb_by_phase": trainer.memory.as_dict(),
    }
    if ctx.device.type == "cuda":
        out["max_memory_allocated_mb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
    return trainer, out


def cpu_reference(ctx: Context, family: str, precision: str, steps: int) -> dict[str, Any]:
    """The first ``steps`` updates' losses of the same config on the CPU, eager (cached per precision)."""
    key = f"{family}/{precision}"
    if key in ctx.cpu_refs:
        return ctx.cpu_refs[key]
    ref_precision, note = precision, ""
    if precision == "bf16" and not (cpu_has_fast_bf16() or ctx.args.quick):
        ref_precision = "fp32"
        note = ("this CPU has no fast bf16 (AMX / AVX512-BF16): bf16 would be emulated, ~100x slower, so the "
                "bf16 run is compared with the fp32 CPU loss")
    if ref_precision != precision:
        ref = dict(cpu_reference(ctx, family, ref_precision, steps))
        ref["note"] = note
        ctx.cpu_refs[key] = ref
        return ref
    cfg = run_config(ctx, f"cpu_ref_{precision}", family, precision, False, steps, "cpu")
    trainer = make_trainer(cfg, load_data(ctx), torch.device("cpu"))
    batches = trainer._batches()  # the trainer's own batch order (the sampler seeded by cfg.seed)
    t = time.time()
    losses = [trainer.train_step([next(batches)])["loss"] for _ in range(steps)]
    ref = {"precision": ref_precision, "losses": losses, "seconds": time.time() - t, "threads": torch.get_num_threads(),
           "note": note}
    ctx.cpu_refs[key] = ref
    return ref


def judge_run(sec: dict[str, Any], name: str, run: dict[str, Any], ref: dict[str, Any], precision: str) -> None:
    """The run's checks: finite, falling, first-update loss vs the CPU within the precision's tolerance."""
    losses = run["losses"]
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    k = max(1, min(3, len(losses) // 4))
    head = statistics.mean(losses[:k]) if losses else math.nan
    tail = statistics.mean(losses[-k:]) if losses else math.nan
    falling = finite and tail < 0.95 * head
    tol = 1e-4 if precision == "fp32" else 1e-2
    cpu_first = ref["losses"][0]
    rel = abs(losses[0] - cpu_first) / abs(cpu_first) if losses else math.inf
    run.update(first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None,
               cpu_first_loss=cpu_first, cpu_precision=ref["precision"], first_loss_rel_diff=rel, tolerance=tol)
    n = min(len(ref["losses"]), len(losses))
    run["cpu_loss_rel_diff_by_update"] = [abs(a - b) / abs(b) for a, b in zip(losses[:n], ref["losses"][:n])]
    check(sec, f"{name}: losses finite", finite, f"{len(losses)} updates")
    check(sec, f"{name}: losses falling", falling, f"mean of first {k} {head:.4f} -> last {k} {tail:.4f}")
    check(sec, f"{name}: first-update loss = CPU's (rel. tol {tol:g})", rel <= tol,
          f"{losses[0]:.6f} vs CPU {ref['precision']} {cpu_first:.6f}: rel diff {rel:.2e}" if losses else "no loss")


def train_and_judge(ctx: Context, sec: dict[str, Any], report: Report, name: str, precision: str, compile_on: bool,
                    updates: int, need_s: float) -> Any:
    """One device run + its CPU reference, recorded in ``sec`` as soon as it is done; a run that
    raises is recorded with its error (a failed check) and the section goes on."""
    runs = sec["results"].setdefault("runs", {})
    try:
        ctx.budget.need(need_s, name)
        cfg = run_config(ctx, name, "encoder-decoder", precision, compile_on, updates, ctx.device.type)
        ref = cpu_reference(ctx, "encoder-decoder", precision, ctx.args.cpu_ref_steps)
        sec["results"]["cpu_references"] = ctx.cpu_refs
        trainer, run = fit_run(ctx, cfg)
    except Stopped:
        raise
    except Exception as err:  # OutOfTime, or the run failed
        what = str(err) if isinstance(err, OutOfTime) else f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"
        runs[name] = {"skipped": what} if isinstance(err, OutOfTime) else {
            "error": what, "traceback": traceback.format_exc(limit=12)[-3000:]}
        check(sec, f"{name}: run", False, what)
        report.write()
        return None
    run["device_name"] = ctx.meta_device
    if ref.get("note"):
        run["cpu_reference_note"] = ref["note"]
    judge_run(sec, name, run, ref, precision)
    runs[name] = run
    ctx.runs[name] = run
    report.write()
    return trainer


def section_training(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """fp32 and bf16, compile off (the fp32 run is the decoding model)."""
    a = ctx.args
    sec["results"]["config"] = {"model": model_overrides(ctx, "encoder-decoder"), "data": "Multi30k en-de" + (
        f" (first {QUICK_SLICE['train']} training pairs)" if a.quick else ""), "max_tokens": 600 if a.quick else 4096,
        "updates": {"fp32": a.decode_updates, "bf16": a.updates}, "cpu_reference_updates": a.cpu_ref_steps}
    trainer = train_and_judge(ctx, sec, report, "fp32", "fp32", False, a.decode_updates, 30)
    if trainer is not None:
        ctx.decode_trainer = trainer
    train_and_judge(ctx, sec, report, "bf16", "bf16", False, a.updates, 20)


def section_training_compile(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """fp32 and bf16 with ``train.compile=true``."""
    if ctx.device.type == "cuda" and importlib.util.find_spec("triton") is None:
        raise RuntimeError("triton is not installed: torch.compile has no GPU backend")
    need = 20 if ctx.args.quick else 75
    for precision in ctx.args.compile_precision:
        train_and_judge(ctx, sec, report, f"{precision}+compile", precision, True, ctx.args.updates, need)


# ----------------------------------------------------------------------------- decoding parity


def hyp_tokens(hyps: list[list[Any]]) -> list[list[int]]:
    """The best hypothesis's ids of every sentence ([] when none)."""
    return [list(h[0].tokens) if h else [] for h in hyps]


def section_decoding(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Greedy and beam 5, fp32, the device against a CPU copy of the same weights."""
    if ctx.decode_trainer is None:
        raise RuntimeError("no trained model: the training section's fp32 run did not finish")
    data = load_data(ctx)
    model = ctx.decode_trainer.model.eval()
    cpu_model = copy.deepcopy(model).to("cpu").eval()
    split = data.splits.get("test_2016_flickr") or data.splits["test"]
    n = min(ctx.args.sentences, len(split))
    src = [list(split.src[i]) for i in range(n)]
    tok = data.tgt_tokenizer
    r = sec["results"]
    r.update(sentences=n, split=split.name, model_updates=ctx.decode_trainer.update, device_name=ctx.meta_device,
             precision="fp32")
    for search, beam in (("greedy", 1), ("beam", 5)):
        gen = GenerationConfig(strategy=search, beam_size=beam)
        out: dict[str, Any] = {}
        hyps = {}
        for name, m, dev in (("device", model, ctx.device), ("cpu", cpu_model, torch.device("cpu"))):
            t = time.time()
            with torch.inference_mode():
                hyps[name] = translate_sentences(m, src, gen, dev)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            out[f"{name}_s"] = time.time() - t
        a, b = hyp_tokens(hyps["device"]), hyp_tokens(hyps["cpu"])
        diff = [i for i in range(n) if a[i] != b[i]]
        out.update(equal=n - len(diff), of=n, mean_len=statistics.mean(len(x) for x in a) if a else 0,
                   first_lines=[tok.decode(x) for x in a[:3]])
        out["differing"] = [{
            "line": i, "source": split.src_text[i].rstrip("\n") if split.src_text else None,
            "device": tok.decode(a[i]), "cpu": tok.decode(b[i]),
            "device_score": hyps["device"][i][0].score if hyps["device"][i] else None,
            "cpu_score": hyps["cpu"][i][0].score if hyps["cpu"][i] else None,
        } for i in diff[:5]]
        r[f"beam{beam}" if beam > 1 else "greedy"] = out
        check(sec, f"{search}{'' if beam == 1 else f' {beam}'}: device = CPU", not diff,
              f"{n - len(diff)}/{n} hypotheses equal")
        report.write()


# ----------------------------------------------------------------------------- SDPA backends

_BACKEND_OPS = {  # aten op (prefix) -> backend
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


def backend_of(op_name: str) -> str | None:
    """The SDPA backend an aten op name belongs to (None for other ops)."""
    for prefix, backend in _BACKEND_OPS.items():
        if op_name == prefix or (op_name.startswith(prefix) and "backward" not in op_name):
            return backend
    return None


class SdpaRecorder:
    """Wraps ``F.scaled_dot_product_attention`` (every SDPA call of the project goes through it):
    each call runs inside ``record_function("sdpa_call#i")`` and is described (attention module,
    shapes, dtype, mask, causal flag); one call of each distinct description keeps its arguments
    for the eligibility replay. Forward hooks on the attention modules name the calling module."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls: list[dict[str, Any]] = []
        self.samples: dict[str, tuple] = {}
        self.stack: list[str] = []
        self.handles: list[Any] = []
        self.original = F.scaled_dot_product_attention

    def __enter__(self) -> "SdpaRecorder":
        def enter(name: str) -> Callable[..., None]:
            def hook(module: Any, args: Any) -> None:
                self.stack.append(name)
            return hook

        def leave(module: Any, args: Any, output: Any) -> None:  # returns None: the output is unchanged
            self.stack.pop()

        for name, mod in self.model.named_modules():
            if isinstance(mod, (Attention, MultiHeadLatentAttention)):
                self.handles.append(mod.register_forward_pre_hook(enter(name)))
                self.handles.append(mod.register_forward_hook(leave))
        original = self.original

        def wrapper(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            module = self.stack[-1] if self.stack else "?"
            if attn_mask is None:
                mask = "none"
            else:
                mask = f"{'bool' if attn_mask.dtype == torch.bool else str(attn_mask.dtype).replace('torch.', '')} " \
                       f"{tuple(attn_mask.shape)}"
            desc = {"module": module, "role": attention_role(module), "q": tuple(q.shape), "k": tuple(k.shape),
                    "dtype": str(q.dtype).replace("torch.", ""), "mask": mask, "is_causal": bool(is_causal),
                    "dropout_p": float(dropout_p), "enable_gqa": bool(enable_gqa), "requires_grad": q.requires_grad}
            key = json.dumps({k2: desc[k2] for k2 in ("role", "dtype", "is_causal", "enable_gqa", "requires_grad")}
                             | {"mask": mask.split(" ")[0], "q1": q.shape[2] == 1})
            desc["key"] = key
            i = len(self.calls)
            self.calls.append(desc)
            if key not in self.samples:  # detached copies; q, k, v keep whether they needed gradients
                self.samples[key] = tuple(
                    x.detach().clone().requires_grad_(x.requires_grad and x.is_floating_point())
                    if isinstance(x, torch.Tensor) else x
                    for x in (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa))
            with torch.profiler.record_function(f"sdpa_call#{i}"):
                return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                enable_gqa=enable_gqa)

        torch.nn.functional.scaled_dot_product_attention = wrapper
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.nn.functional.scaled_dot_product_attention = self.original
        for h in self.handles:
            h.remove()


def attention_role(module: str) -> str:
    """``encoder self-attention`` / ``decoder self-attention`` / ``cross-attention`` from a module's name."""
    if "cross" in module:
        return "cross-attention"
    if module.startswith("encoder"):
        return "encoder self-attention"
    return "decoder self-attention"


def _descendants(evt: Any) -> list[Any]:
    out, todo = [], list(getattr(evt, "cpu_children", []) or [])
    while todo:
        e = todo.pop()
        out.append(e)
        todo.extend(getattr(e, "cpu_children", []) or [])
    return out


def attribute_backends(prof: Any, calls: list[dict[str, Any]]) -> None:
    """Fill ``backend`` (and ``kernels``) of every recorded call from the profile's events."""
    for evt in prof.events():
        if not evt.name.startswith("sdpa_call#"):
            continue
        i = int(evt.name.split("#", 1)[1])
        if i >= len(calls):
            continue
        found, kernels = [], set()
        for child in _descendants(evt):
            b = backend_of(child.name)
            if b:
                found.append(b)
            for kern in getattr(child, "kernels", []) or []:
                kernels.add(getattr(kern, "name", str(kern))[:120])
        calls[i]["backend"] = found[0] if found else "unidentified"
        calls[i]["kernels"] = sorted(kernels)[:4]


def eligible_backends(sample: tuple, device: torch.device) -> tuple[list[str], dict[str, str]]:
    """Replay one SDPA call with each backend alone: those that run, and torch's reason for the others."""
    q, k, v, mask, dropout_p, is_causal, scale, gqa = sample
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    if device.type == "cuda":
        backends.update(efficient=SDPBackend.EFFICIENT_ATTENTION, cudnn=SDPBackend.CUDNN_ATTENTION)
    ok, why = [], {}
    for name, b in backends.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([b]):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                                   scale=scale, enable_gqa=gqa)
                ok.append(name)
            except Exception as err:  # RuntimeError: no available kernel
                reasons: list[str] = []
                for w in caught:  # torch warns why each kernel was refused, then raises "No available kernel"
                    text = " ".join(str(w.message).split("(Triggered internally")[0].split())
                    if text and text not in reasons:
                        reasons.append(text)
                why[name] = (" | ".join(reasons) or " ".join(str(err).split()))[:400]
    return ok, why


def summarise_calls(calls: list[dict[str, Any]], samples: dict[str, tuple], device: torch.device) -> list[dict[str, Any]]:
    """One row per distinct kind of call: count, backends that ran, eligibility and reasons."""
    rows: dict[str, dict[str, Any]] = {}
    for c in calls:
        row = rows.setdefault(c["key"], {
            "role": c["role"], "dtype": c["dtype"], "mask": c["mask"].split(" ")[0], "mask_example": c["mask"],
            "is_causal": c["is_causal"], "enable_gqa": c["enable_gqa"], "q_example": c["q"], "k_example": c["k"],
            "requires_grad": c["requires_grad"], "calls": 0, "backends": {}, "kernels": set()})
        row["calls"] += 1
        row["backends"][c.get("backend", "unidentified")] = row["backends"].get(c.get("backend", "unidentified"), 0) + 1
        row["kernels"].update(c.get("kernels", []))
    out = []
    for key, row in rows.items():
        row["kernels"] = sorted(row["kernels"])[:4]
        row["eligible"], row["not_eligible_because"] = eligible_backends(samples[key], device)
        out.append(row)
    return out


def profile_sdpa(ctx: Context, family: str, precision: str, phases: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The SDPA calls of one training forward (``train``) and of greedy / beam decoding."""
    data = load_data(ctx)
    cfg = run_config(ctx, f"sdpa_{family}_{precision}", family, precision, False, 1, ctx.device.type)
    trainer = make_trainer(cfg, data, ctx.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    out: dict[str, list[dict[str, Any]]] = {}
    split = data.splits.get("test_2016_flickr") or data.splits["test"]
    src = [list(split.src[i]) for i in range(min(4, len(split)))]  # the kernels do not depend on the count
    for phase in phases:
        rec = SdpaRecorder(trainer.model)
        with rec, profile(activities=activities) as prof:
            if phase == "train forward":
                trainer.model.train()
                batch = next(trainer._batches())
                out_loss = trainer._loss(batch)
                backward = out_loss["loss"]
            else:
                trainer.model.eval()
                # a few steps are enough: every step after the first calls SDPA the same way
                gen = GenerationConfig(strategy="greedy" if phase == "greedy decoding" else "beam",
                                       beam_size=1 if phase == "greedy decoding" else 5, max_len_a=0.0, max_len_b=6)
                with torch.inference_mode():
                    translate_sentences(trainer.model, src, gen, ctx.device)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
        attribute_backends(prof, rec.calls)
        rows = summarise_calls(rec.calls, rec.samples, ctx.device)
        if phase == "train forward":
            with profile(activities=activities) as prof_b:
                backward.backward()
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize(ctx.device)
            names: dict[str, int] = {}
            for evt in prof_b.events():
                if "attention" in evt.name and "backward" in evt.name and evt.name.startswith("aten::_"):
                    names[evt.name] = names.get(evt.name, 0) + 1
            for row in rows:
                row["backward_ops_in_step"] = names
        out[phase] = rows
    return out


def section_sdpa(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Both families, fp32 and bf16 training forward, fp32 decoding."""
    r = sec["results"]
    r["device_name"] = ctx.meta_device
    r["rules"] = SDPA_RULES
    found = []
    for family in ("encoder-decoder", "decoder-only"):
        for precision in ("fp32", "bf16"):
            phases = ["train forward"] + (["greedy decoding", "beam decoding"] if precision == "fp32" else [])
            try:
                res = profile_sdpa(ctx, family, precision, phases)
            except Stopped:
                raise
            except Exception as err:  # the other family / precision still runs
                msg = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
                r.setdefault("errors", {})[f"{family} {precision}"] = traceback.format_exc(limit=10)[-3000:]
                check(sec, f"{family} {precision}: profiled", False, msg)
                report.write()
                continue
            for phase, rows in res.items():
                for row in rows:
                    row.update(family=family, precision=precision, phase=phase)
                    found.append(row)
            r["calls"] = found
            report.write()
    unknown = [f"{x['family']} {x['phase']} {x['role']}" for x in found if "unidentified" in x["backends"]]
    check(sec, "a backend identified for every SDPA call", not unknown and bool(found),
          "; ".join(unknown[:5]) or f"{sum(x['calls'] for x in found)} calls")
    if ctx.device.type == "cpu":
        check(sec, "CPU backends only", all(set(x["backends"]) <= {"flash (CPU)", "math"} for x in found),
              ", ".join(sorted({b for x in found for b in x["backends"]})))


SDPA_RULES = (
    "PyTorch picks the first eligible SDPA backend (CUDA order: flash, memory-efficient, math; cuDNN only where "
    "torch prefers it). Flash attention needs fp16/bf16 inputs and no attn_mask (only is_causal), so fp32 "
    "calls and calls with a padding mask cannot use it; memory-efficient attention takes fp32 and a mask. "
    "The project passes is_causal=True without a mask where the batch needs no key padding, a bool mask "
    "(True = attend) where it does (padding of the source in encoder and cross-attention; padding plus "
    "causality in a decoder-only batch), and no mask for one query over a cache. On the CPU the candidates are "
    "the CPU flash kernel and math; under CPU autocast attention runs in fp32 (transformer/modules/attention_core.py)."
)


# ----------------------------------------------------------------------------- throughput and MFU


def section_throughput(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Ours vs HF at tiny / small / base, fp32 and bf16: tokens/s, MFU, peak memory."""
    a, dev = ctx.args, ctx.device
    r = sec["results"]
    peaks: dict[str, float] = {}
    source: dict[str, str] = {}
    for prec, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        table = device_peak(ctx.meta_device, prec) if dev.type == "cuda" else None
        if table:
            peaks[prec], source[prec] = table, "datasheet (DEVICE_PEAKS, dense)"
        elif dev.type == "cuda":
            peaks[prec], source[prec] = cuda_matmul_peak(dev, dtype), "measured (best torch.mm 4096^3 / 8192^3)"
        else:
            peaks[prec], source[prec] = matmul_peak(reps=2, dtype=dtype), "measured (best torch.mm, CPU)"
    if dev.type == "cuda":  # the probe beside the table, to see how close the table is
        r["measured_matmul_tflops"] = {p: cuda_matmul_peak(dev, d) / 1e12 for p, d in
                                       (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    r.update(device_name=ctx.meta_device, peaks_tflops={k: v / 1e12 for k, v in peaks.items()}, peak_source=source,
             batch={"rows": a.rows, "src_len": SRC_LEN, "tgt_len": TGT_LEN}, warmup=a.warmup, steps=a.steps,
             rows=[])
    report.write()
    peers = {"encoder-decoder": a.encdec_peers, "decoder-only": a.decoder_peers}
    for size in a.sizes:
        ed, do, _ = SIZES[size]
        for family, preset_name in (("encoder-decoder", ed), ("decoder-only", do)):
            over = PRESET_OVERRIDES.get((size, family), [])
            cfg, _ = preset(preset_name, over)
            flops = train_flops(cfg, a.rows, SRC_LEN, TGT_LEN)
            for prec in a.precision:
                ours_row = None
                for model in ["ours", *peers[family]]:
                    spec = {"model": model, "preset": preset_name, "rows": a.rows, "src_len": SRC_LEN, "tgt_len": TGT_LEN,
                            "warmup": a.warmup, "steps": a.steps, "precision": prec,
                            "overrides": over + (["model.dropout=0.0"] if family == "decoder-only" and model == "ours"
                                                 else [])}
                    row = {"size": size, "family": family, "model": model, "precision": prec, "preset": preset_name,
                           "overrides": over}
                    try:
                        ctx.budget.need(10 if a.quick else 12, f"{size} {family} {model} {prec}")
                        m = measure(spec, dev)
                        tok_s = a.rows * TGT_LEN / m["step_s"]
                        row.update(tok_s=tok_s, step_ms=1e3 * m["step_s"], best_ms=1e3 * m["best_s"],
                                   mfu_vs_bf16_peak=flops / m["step_s"] / peaks["bf16"],
                                   mfu_vs_dtype_peak=flops / m["step_s"] / peaks[prec], mem_mb=m.get("mem_mb"),
                                   params=m["params"], dropout=m["dropout"], train_flops_per_step=flops)
                        if model == "ours":
                            ours_row = row
                        elif ours_row is not None:
                            row["ratio_to_ours"] = tok_s / ours_row["tok_s"]
                    except Stopped:
                        raise
                    except Exception as err:
                        row["skipped"] = " ".join(f"{type(err).__name__}: {err}".split())[:300]
                        if model == "ours":
                            check(sec, f"{size} {family} ours {prec}", False, row["skipped"])
                    r["rows"].append(row)
                    report.write()
    measured = [x for x in r["rows"] if "tok_s" in x and x["model"] == "ours"]
    check(sec, "our rows measured", bool(measured), f"{len(measured)} of ours measured")


def measure(spec: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """One throughput row in this process (CUDA: :func:`train_throughput.measure_on_cuda`; CPU: step
    times only, memory is per process in ``train_throughput.py`` and is not measured here)."""
    if device.type == "cuda":
        return measure_on_cuda(spec, device)
    cfg, optim_cfg, batch, ctor = model_under_test(spec)
    torch.manual_seed(0)
    model = ctor()
    opt = make_optimizer(model, optim_cfg)
    r = time_steps(model, batch, opt, spec["warmup"], spec["steps"], spec["precision"])
    r.update(params=sum(p.numel() for p in model.parameters()), mem_mb=None,
             dropout=our_dropout(cfg) if spec["model"] == "ours" else getattr(model, "dropout_desc", "?"))
    return r


# ----------------------------------------------------------------------------- study summary


def study_summary(runs_dir: Path, out: Path, device_name: str, note: str) -> dict[str, Any]:
    """Per run folder of a ``results_gpu.sh`` study: updates reached, last tokens/s, validation and
    test BLEU (``results.json`` when the run finished); written to ``out/study_progress.{json,md}``."""
    rows = []
    for metrics in sorted(runs_dir.glob("**/metrics.jsonl")):
        run = metrics.parent
        recs = []
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        train = [x for x in recs if x.get("split") == "train"]
        valid = [x for x in recs if x.get("split") == "valid"]
        res = run / "results.json"
        done = json.loads(res.read_text()) if res.is_file() else None
        cfg_file = run / "config.yaml"
        cfg = OmegaConf.load(cfg_file) if cfg_file.is_file() else None
        rows.append({
            "run": str(run.relative_to(runs_dir)), "updates": train[-1]["update"] if train else 0,
            "precision": (done or {}).get("precision") or (cfg.train.precision if cfg is not None else None),
            "device": cfg.train.device if cfg is not None else None,
            "max_updates": cfg.train.max_updates if cfg is not None else None,
            "tokens_per_s": train[-1].get("tokens_per_s") if train else None,
            "last_valid": {k: valid[-1].get(k) for k in ("update", "loss", "bleu")} if valid else None,
            "finished": done is not None, "test_bleu": done.get("bleu") if done else None,
            "wall_time_s": done.get("wall_time_s") if done else None,
        })
    res = {"device_name": device_name, "note": note, "runs_dir": str(runs_dir), "runs": rows,
           "date": datetime.date.today().isoformat(), "commit": git_commit()}
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "study_progress.json", json.dumps(res, indent=1) + "\n")
    lines = [f"# results_gpu.sh study on {device_name}: progress", "", f"{note}  ", f"Date {res['date']}, commit "
             f"`{res['commit']}`; runs in `{runs_dir}`. Precision as each run's config says (the ladder and the Wu "
             "recipe pin fp32, so that these runs compare with the CPU runs).", "",
             "| run | device | precision | updates / budget | train tok/s (last window) | last valid (update: loss / BLEU) | "
             "finished | test BLEU |", "|---|---|---|---:|---:|---|---|---:|"]
    for x in rows:
        v = x["last_valid"]
        vs = f"{v['update']}: {v['loss']:.3f} / {v['bleu'] if v['bleu'] is not None else '-'}" if v else ""
        lines.append(f"| {x['run']} | {x['device']} | {x['precision']} | {x['updates']} / {x['max_updates']} | "
                     f"{x['tokens_per_s'] or 0:,.0f} | {vs} | "
                     f"{'yes' if x['finished'] else 'no'} | {x['test_bleu'] if x['test_bleu'] is not None else ''} |")
    _atomic_write(out / "study_progress.md", "\n".join(lines) + "\n")
    return res


# ----------------------------------------------------------------------------- markdown


def _f(x: Any, fmt: str = "{:.4f}") -> str:
    return "" if x is None else fmt.format(x)


def markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: a status table, then one part per section."""
    m = data["meta"]
    gpu = m["device"] == "cuda"
    budget = f"budget {float(m['budget_s']):.0f} s" if m["budget_s"] else "no time budget"
    lines = [f"# GPU check: {m['device_name']}", "",
             (f"**GPU results** ({m['device_name']}, `--device cuda{' --quick' if m['quick'] else ''}`)." if gpu else
              f"**CPU smoke run, not GPU results** (`--device cpu{' --quick' if m['quick'] else ''}` on {m['device_name']})."),
             "", f"Command: `{m['command']}`  ", f"Date: {m['date']}; commit `{m['commit']}`; torch {m['torch']}"
             f"{', CUDA ' + str(m['cuda']) if m.get('cuda') else ''}; "
             f"{budget}; written {m.get('written', '')}",
             "", "| section | status | seconds | note |", "|---|---|---:|---|"]
    for name in SECTIONS:
        s = data["sections"].get(name)
        if s is None:
            lines.append(f"| {name} | not run | | |")
            continue
        note = s.get("error") or s.get("reason") or "; ".join(s.get("notes", [])) or ""
        if s["status"] == "running":
            note = "incomplete: the process stopped during this section"
        lines.append(f"| {name} | {s['status']} | {_f(s.get('seconds'), '{:.0f}')} | {note.replace('|', '/')[:300]} |")
    for name in SECTIONS:
        s = data["sections"].get(name)
        if not s or s["status"] == "skipped":
            continue
        lines += ["", f"## {name}", ""]
        if s["checks"]:
            lines += ["| check | held | detail |", "|---|---|---|"]
            lines += [f"| {c['name']} | {'yes' if c['passed'] else '**no**'} | {c['detail'].replace('|', '/')} |"
                      for c in s["checks"]]
            lines.append("")
        lines += RENDER.get(name, _render_plain)(s["results"])
    return "\n".join(lines) + "\n"


def _render_plain(r: dict[str, Any]) -> list[str]:
    return [f"- {k}: {v}" for k, v in r.items()]


def _render_training(r: dict[str, Any]) -> list[str]:
    out = []
    if r.get("config"):
        out += [f"Config: {r['config']}", ""]
    out += ["| run | precision | compile | updates | first loss | CPU first loss | rel diff | tol | last loss | "
            "tok/s (median, 2nd half) | first update s | peak MiB (training) |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, x in (r.get("runs") or {}).items():
        if "skipped" in x or "error" in x:
            out.append(f"| {name} | | | | {(x.get('skipped') or x.get('error')).replace('|', '/')[:200]} | | | | | | | |")
            continue
        peak = (x.get("peak_memory_mb_by_phase") or {}).get("training")
        peak = peak if not isinstance(peak, dict) else peak.get("peak_mb", peak.get("allocated_mb"))
        out.append(f"| {name} | {x['precision']} | {x['compile']} | {x['updates']} | {_f(x.get('first_loss'), '{:.6f}')} | "
                   f"{_f(x.get('cpu_first_loss'), '{:.6f}')} ({x.get('cpu_precision')}) | {_f(x.get('first_loss_rel_diff'), '{:.1e}')} | "
                   f"{x.get('tolerance')} | {_f(x.get('last_loss'))} | {_f(x.get('tokens_per_s_median_2nd_half'), '{:,.0f}')} | "
                   f"{_f(x.get('first_update_s'), '{:.2f}')} | {_f(peak if isinstance(peak, (int, float)) else x.get('max_memory_allocated_mb'), '{:,.0f}')} |")
        if x.get("cpu_reference_note"):
            out.append(f"| | note: {x['cpu_reference_note']} | | | | | | | | | | |")
    return out


def _render_decoding(r: dict[str, Any]) -> list[str]:
    out = [f"{r.get('sentences')} sentences of {r.get('split')}, model after {r.get('model_updates')} updates, fp32, "
           f"{r.get('device_name')} vs the CPU.", "", "| search | equal | device s | CPU s | mean length | first lines (device) |",
           "|---|---:|---:|---:|---:|---|"]
    for key in ("greedy", "beam5"):
        x = r.get(key)
        if x:
            out.append(f"| {key} | {x['equal']}/{x['of']} | {x['device_s']:.2f} | {x['cpu_s']:.2f} | {x['mean_len']:.1f} | "
                       + " / ".join(x["first_lines"]).replace("|", "/")[:200] + " |")
    for key in ("greedy", "beam5"):
        for d in (r.get(key) or {}).get("differing", []):
            out.append(f"\n{key} line {d['line']}: device `{d['device']}` ({_f(d['device_score'])}) vs CPU `{d['cpu']}` "
                       f"({_f(d['cpu_score'])})")
    return out


def _render_sdpa(r: dict[str, Any]) -> list[str]:
    out = [r.get("rules", ""), "", "| family | phase | precision | attention | calls | backend used | mask | is_causal | "
           "GQA | eligible | why not flash / efficient |", "|---|---|---|---|---:|---|---|---|---|---|---|"]
    for x in r.get("calls", []):
        used = ", ".join(f"{b} x{n}" for b, n in x["backends"].items())
        why = "; ".join(f"{b}: {w}" for b, w in x["not_eligible_because"].items() if b in ("flash", "efficient"))
        out.append(f"| {x['family']} | {x['phase']} | {x['precision']} | {x['role']} | {x['calls']} | {used} | "
                   f"{x['mask_example']} | {x['is_causal']} | {x['enable_gqa']} | {', '.join(x['eligible'])} | "
                   f"{why.replace('|', '/')[:240]} |")
    kernels = sorted({k for x in r.get("calls", []) for k in x.get("kernels", [])})
    if kernels:
        out += ["", "CUDA kernels seen under the SDPA calls: " + ", ".join(f"`{k}`" for k in kernels[:12])]
    back = {}
    for x in r.get("calls", []):
        for k, n in (x.get("backward_ops_in_step") or {}).items():
            back[f"{x['family']} {x['precision']}: {k}"] = n
    if back:
        out += ["", "Backward attention ops of the training step: " + "; ".join(f"{k} x{n}" for k, n in back.items())]
    return out


def _render_throughput(r: dict[str, Any]) -> list[str]:
    out = [f"Device {r.get('device_name')}; peaks (TFLOP/s) {r.get('peaks_tflops')} from {r.get('peak_source')}"
           + (f"; measured matmul TFLOP/s {r['measured_matmul_tflops']}" if r.get("measured_matmul_tflops") else "")
           + f"; batch {r.get('batch')}, median of {r.get('steps')} steps after {r.get('warmup')}. MFU = 3 x forward "
           "FLOPs (benchmarks/train_throughput.py's count) / step time / peak.", "",
           "| size | family | model | precision | target tok/s | ratio to ours | MFU vs bf16 peak | MFU vs dtype peak | "
           "step ms | peak MiB |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for x in r.get("rows", []):
        if "tok_s" not in x:
            out.append(f"| {x['size']} | {x['family']} | {x['model']} | {x['precision']} | skipped: "
                       f"{x.get('skipped', '').replace('|', '/')[:160]} | | | | | |")
            continue
        out.append(f"| {x['size']} | {x['family']} | {x['model']} | {x['precision']} | {x['tok_s']:,.0f} | "
                   f"{_f(x.get('ratio_to_ours'), '{:.2f}')} | {100 * x['mfu_vs_bf16_peak']:.1f}% | "
                   f"{100 * x['mfu_vs_dtype_peak']:.1f}% | {x['step_ms']:.1f} | {_f(x.get('mem_mb'), '{:,.0f}')} |")
    return out


RENDER: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "training": _render_training, "training_compile": _render_training, "decoding": _render_decoding,
    "sdpa": _render_sdpa, "throughput": _render_throughput,
}


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--quick`` changes the defaults marked *)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps: the CPU smoke mode (seconds)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default docs/benchmarks/gpu/ on cuda, runs/gpu_check_cpu/ on cpu)")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "gpu_check_work",
                   help="checkpoints, data cache, smoke corpus (not results)")
    p.add_argument("--budget-s", type=float, default=None, help="* seconds for everything (390; --quick: no limit)")
    p.add_argument("--skip", nargs="*", default=[], choices=list(SECTIONS[1:]), help="sections recorded as skipped")
    p.add_argument("--updates", type=int, default=None, help="* updates of the bf16 and compile runs (40; --quick 8)")
    p.add_argument("--decode-updates", type=int, default=None,
                   help="* updates of the fp32 run, the decoding model (300; --quick 8)")
    p.add_argument("--compile-precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                   help="precisions of the training_compile section")
    p.add_argument("--cpu-ref-steps", type=int, default=None, help="* updates of each CPU reference (3; --quick 2)")
    p.add_argument("--sentences", type=int, default=50, help="test sentences of the decoding check")
    p.add_argument("--sizes", nargs="+", default=None, choices=["tiny", "small", "base"],
                   help="* throughput sizes (tiny small base; --quick tiny)")
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--rows", type=int, default=None, help="* throughput batch rows x 24 target tokens (256; --quick 4)")
    p.add_argument("--warmup", type=int, default=None, help="* throughput warm-up steps (3; --quick 1)")
    p.add_argument("--steps", type=int, default=None, help="* throughput measured steps, median (10; --quick 2)")
    p.add_argument("--encdec-peers", nargs="*", default=["HF Marian"], help="encoder-decoder peers (benchmarks/peers.py)")
    p.add_argument("--decoder-peers", nargs="*", default=["HF Llama"], help="decoder-only peers")
    p.add_argument("--threads", type=int, default=None, help="* torch CPU threads (all cores; --quick 1)")
    p.add_argument("--study-summary", type=Path, default=None, metavar="RUNS_DIR",
                   help="summarise a results_gpu.sh study's run folders into --out instead")
    p.add_argument("--study-note", default="", help="a sentence for the study summary (time cap, ...)")
    return p


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the *-marked options from ``--quick`` and ``--device``."""
    q = args.quick
    for name, normal, quick in (("budget_s", 390.0, 0.0), ("updates", 40, 8), ("decode_updates", 300, 8),
                                ("cpu_ref_steps", 3, 2), ("sizes", ["tiny", "small", "base"], ["tiny"]),
                                ("rows", 256, 4), ("warmup", 3, 1), ("steps", 10, 2),
                                ("threads", len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
                                 os.cpu_count() or 1, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else normal)
    if args.out is None:
        args.out = REPO / "docs" / "benchmarks" / "gpu" if args.device == "cuda" else REPO / "runs" / "gpu_check_cpu"
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the sections in order of cost (compile last); 0 when every section passed, else 1."""
    args = apply_defaults(build_parser().parse_args(argv))
    if args.study_summary is not None:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU {cpu_model_name()}"
        study_summary(args.study_summary, args.out, name, args.study_note)
        return 0
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: --device cuda but torch {torch.__version__} sees no CUDA device "
              f"(torch.version.cuda={torch.version.cuda})", file=sys.stderr)
    device = torch.device("cuda", 0) if args.device == "cuda" and torch.cuda.is_available() else torch.device(args.device)
    desc = device_description(device) if device.type == "cpu" or torch.cuda.is_available() else {
        "device": "cuda", "device_name": "no CUDA device"}
    meta = {"command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": datetime.date.today().isoformat(), "commit": git_commit(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "quick": args.quick, "budget_s": args.budget_s, **desc,
            "args": {k: str(v) for k, v in vars(args).items()}}
    report = Report(args.out, meta)
    ctx = Context(args=args, device=device, budget=Budget(args.budget_s), data_dir=find_data_dir(), work=args.work)
    ctx.meta_device = desc["device_name"]
    args.work.mkdir(parents=True, exist_ok=True)

    def on_term(signum: int, frame: Any) -> None:
        raise Stopped(f"stopped by signal {signal.Signals(signum).name} (a time cap) during this section")

    signal.signal(signal.SIGTERM, on_term)
    plan: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
        ("environment", lambda s: section_environment(s, ctx)),
        ("training", lambda s: section_training(s, ctx, report)),
        ("decoding", lambda s: section_decoding(s, ctx, report)),
        ("sdpa", lambda s: section_sdpa(s, ctx, report)),
        ("throughput", lambda s: section_throughput(s, ctx, report)),
        ("training_compile", lambda s: section_training_compile(s, ctx, report)),
    ]
    report.write()
    stopped = None
    for name, fn in plan:
        if stopped:
            report.skip(name, stopped)
        elif name in args.skip:
            report.skip(name, "--skip")
        elif device.type == "cuda" and not torch.cuda.is_available() and name != "environment":
            report.skip(name, "no CUDA device")
        else:
            try:
                report.run(name, fn)
            except Stopped as err:
                stopped = f"not run: {err}"
    statuses = {n: s["status"] for n, s in report.data["sections"].items()}
    print(f"gpu_check: {statuses}; wrote {args.out / 'gpu_check.json'} and gpu_check.md", file=sys.stderr)
    return 0 if all(s in ("passed", "skipped") for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
