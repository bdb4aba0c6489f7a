"""What the sections of the GPU check (``benchmarks/gpu_check/``) share, and the ``environment`` section: the
:class:`Context` (arguments, device, data, CPU references, the trained model), the runs' configs
(``transformer_tiny`` / ``llama_style_tiny`` on Multi30k, a slice of it with ``--quick``) and one
training run with :meth:`~transformer.training.loop.trainer.Trainer.fit` (:func:`fit_run`)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO, git_commit
from benchmarks.train_step import compose_config, device_peak, make_trainer
from transformer.data.dataset import load_translation_data
from transformer.data.download import excerpt_overrides, multi30k_excerpt
from transformer.precision import cpu_model_name, describe_hardware
from transformer.training import MetricsLogger

from .presets import QUICK_DIMS
from .report import Budget, check

OPTIONAL = {  # module: what is lost without it
    "transformers": "the HF Marian / HF Llama rows of the realistic section",
    "triton": "torch.compile on CUDA (inductor's GPU kernels): the training_compile section",
    "matplotlib": "scripts/compare.py's plots in the study (the tables are still written)",
}


# ----------------------------------------------------------------------------- environment


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
        return {
            "device": "cuda",
            "device_name": torch.cuda.get_device_name(device),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
        }
    return {"device": "cpu", "device_name": cpu_model_name()}


def section_environment(sec: dict[str, Any], ctx: Context, report: Any = None) -> None:
    """Versions, flags and what is missing."""
    r = sec["results"]
    r.update(device_description(ctx.device))
    hw = describe_hardware()
    r.update(
        torch=hw["torch"],
        cuda=torch.version.cuda,
        python=platform.python_version(),
        cpu=hw["cpu"],
        cpu_count=hw["cpu_count"],
        torch_threads=hw["torch_threads"],
        cuda_available=torch.cuda.is_available(),
        transformers=version("transformers"),
        triton=version("triton") or version("pytorch-triton"),
        data_dir=str(ctx.data_dir) if ctx.data_dir else None,
        commit=git_commit(),
    )
    missing_opt = [
        f"{m} ({why})"
        for m, why in OPTIONAL.items()
        if importlib.util.find_spec(m) is None and (m != "triton" or ctx.device.type == "cuda")
    ]
    r["missing_optional"] = missing_opt
    if ctx.device.type == "cuda":
        r.update(
            cudnn=torch.backends.cudnn.version(),
            gpu_count=torch.cuda.device_count(),
            matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
            cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
            float32_matmul_precision=torch.get_float32_matmul_precision(),
            sdpa_enabled={
                "flash": torch.backends.cuda.flash_sdp_enabled(),
                "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                "math": torch.backends.cuda.math_sdp_enabled(),
            },
            peak_table_bf16=device_peak(r["device_name"], "bf16"),
        )
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            r["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.SubprocessError) as err:
            r["nvidia_smi"] = f"not run: {err}"
    for m in missing_opt:
        sec["notes"].append(f"missing (optional): {m}")
    if ctx.data_dir is None:
        sec["notes"].append(
            "no Multi30k found ($TRANSFORMER_DATA_DIR, <repo>/shared/data, <repo>/../shared/data): "
            "the training, decoding and sdpa sections fail; copy the data folder next to the repo"
        )
    check(
        sec,
        "device usable",
        ctx.device.type == "cpu" or torch.cuda.is_available(),
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}",
    )
    check(sec, "Multi30k found", ctx.data_dir is not None, str(ctx.data_dir))


# ----------------------------------------------------------------------------- configs, data, runs


QUICK_SLICE = {"train": 600, "val": 40, "test_2016_flickr": 60}


@dataclasses.dataclass
class Context:
    """What the sections share: arguments, device, data, the CPU references, the trained model, the
    device's peak and the trainer section's corpus and rows."""

    args: argparse.Namespace
    device: torch.device
    budget: Budget
    data_dir: Path | None
    work: Path
    data: Any = None
    cpu_refs: dict[str, Any] = dataclasses.field(default_factory=dict)
    decode_trainer: Any = None
    runs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    peak: tuple[float, str] | None = None  # the device's dense bf16 peak (FLOP/s) and its source
    trainer_data: Any = None  # the trainer section's WMT-like corpus (built once)
    trainer_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # its rows, for the realistic table


def data_overrides(ctx: Context) -> list[str]:
    """The ``data`` part of every run's config: Multi30k en-de (with ``--quick``, the first
    :data:`QUICK_SLICE` pairs of it in ``<work>/corpus``, its data cache inside).

    Raises:
        RuntimeError: no Multi30k was found (``ctx.data_dir`` is None).
    """
    if ctx.data_dir is None:
        raise RuntimeError("no Multi30k data (set TRANSFORMER_DATA_DIR to the folder holding multi30k/)")
    if ctx.args.quick:
        corpus = ctx.work / "corpus"
        if not (corpus / "test_2016_flickr.de").is_file():  # the excerpt's last file: there, the excerpt is whole
            multi30k_excerpt(ctx.data_dir, corpus, QUICK_SLICE)
        return excerpt_overrides(corpus, 300)
    # the default data cache (keyed by the training files' contents): results_gpu.sh's preprocessing
    # of multi30k_en_de after the check then finds it built
    return ["data=multi30k_en_de", f"data.root={ctx.data_dir}", "data.test_splits=[test_2016_flickr]"]


def model_overrides(ctx: Context, family: str) -> list[str]:
    """``transformer_tiny`` / ``llama_style_tiny`` (:data:`.presets.QUICK_DIMS` with ``--quick``), dropout 0."""
    name = "transformer_tiny" if family == "encoder-decoder" else "llama_style_tiny"
    return [f"model={name}", *(QUICK_DIMS[family] if ctx.args.quick else []), "model.dropout=0.0"]


def train_overrides(ctx: Context, name: str, precision: str, compile_on: bool, updates: int, device: str) -> list[str]:
    """What every run of the check sets of ``train``: ``updates`` updates, no time limit, no validation
    until the end, no BLEU, no checkpoints, no progress bar, seed 1, run folder ``<work>/runs/<name>``."""
    return [
        f"train.max_updates={updates}",
        "train.max_time=0",
        "train.validate_every=0",
        "train.valid_bleu=false",
        "train.save_every=0",
        "train.progress=false",
        f"train.precision={precision}",
        f"train.compile={str(compile_on).lower()}",
        f"train.device={device}",
        "seed=1",
        f"run_dir={ctx.work / 'runs' / name}",
    ]


def run_config(
    ctx: Context, name: str, family: str, precision: str, compile_on: bool, updates: int, device: str
) -> Any:
    """One training run's config: the family's model, Multi30k, :func:`train_overrides`, every update logged."""
    q = ctx.args.quick
    return compose_config(
        model_overrides(ctx, family)
        + data_overrides(ctx)
        + train_overrides(ctx, name, precision, compile_on, updates, device)
        + [
            f"train.max_tokens={600 if q else 4096}",
            "train.log_every=1",
            f"optim.lr={3e-3 if q else 5e-3}",
            f"lr_scheduler.warmup_updates={4 if q else 100}",
        ]
    )


def load_data(ctx: Context) -> Any:
    """The corpus (tokenizers and binarized splits), loaded once."""
    if ctx.data is None:
        cfg = run_config(ctx, "data", "encoder-decoder", "fp32", False, 1, "cpu")
        ctx.data = load_translation_data(cfg.data, log=None)
    return ctx.data


class Collect(MetricsLogger):
    """The metrics sink :meth:`Trainer.fit` logs to, in memory: the numbers of every record."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def log(self, metrics: dict[str, Any], step: int, split: str) -> None:
        """Keep the numbers of one record."""
        self.rows.append(
            {"split": split, "update": step, **{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}}
        )


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
    later = rates[len(rates) // 2 :] or rates
    out = {
        "updates": trainer.update,
        "stop": stop,
        "precision": trainer.precision,
        "compile": cfg.train.compile,
        "losses": [r["loss"] for r in train_rows],
        "valid_loss": next((r["loss"] for r in sink.rows if r["split"] == "valid"), None),
        "wall_s": wall,
        "first_update_s": first_s,
        "tokens_per_s_median_2nd_half": statistics.median(later) if later else None,
        "tokens_per_s_overall": trainer.state.train_tokens / max(trainer.state.train_time, 1e-9),
        "peak_memory_mb_by_phase": trainer.memory.as_dict(),
        "peak_mb": trainer.memory.as_dict().get("training"),
    }
    if ctx.device.type == "cuda":
        out["max_memory_allocated_mb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
    return trainer, out
