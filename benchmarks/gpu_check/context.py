"""What the sections of the GPU check (``benchmarks/gpu_check/``) share, and the ``environment`` section: the
:class:`Context` (arguments, device, data, CPU references, the trained model), the runs' configs
(``transformer_tiny`` / ``llama_style_tiny`` on Multi30k, a slice of it with ``--quick``) and one
training run with :meth:`~transformer.training.loop.trainer.Trainer.fit` (:func:`fit_run`)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import platform
import statistics
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO, git_commit, reset_peak
from benchmarks.train_step import compose_config, device_peak, make_trainer
from transformer.analysis import load_run
from transformer.data.dataset import load_translation_data
from transformer.data.download import excerpt_overrides, multi30k_excerpt
from transformer.precision import cpu_model_name, describe_hardware
from transformer.training import JsonlLogger

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
    return next((Path(c).resolve() for c in candidates if c and (Path(c) / "multi30k" / "train.en.gz").is_file()), None)


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
    r.update(device_description(ctx.device), **describe_hardware(), python=platform.python_version())
    r.update(cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(), commit=git_commit())
    r.update(transformers=version("transformers"), triton=version("triton") or version("pytorch-triton"))
    r["data_dir"] = str(ctx.data_dir) if ctx.data_dir else None
    cuda = ctx.device.type == "cuda"
    missing = [f"{m} ({why})" for m, why in OPTIONAL.items() if find_spec(m) is None and (m != "triton" or cuda)]
    r["missing_optional"] = missing
    sec["notes"] += [f"missing (optional): {m}" for m in missing]
    if cuda:
        sdpa = {
            b: getattr(torch.backends.cuda, f"{b}_sdp_enabled")() for b in ("flash", "mem_efficient", "cudnn", "math")
        }
        r.update(cudnn=torch.backends.cudnn.version(), gpu_count=torch.cuda.device_count(), sdpa_enabled=sdpa)
        r.update(
            matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32, cudnn_allow_tf32=torch.backends.cudnn.allow_tf32
        )
        r["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        r["peak_table_bf16"] = device_peak(r["device_name"], "bf16")
    if ctx.data_dir is None:
        sec["notes"].append(
            "no Multi30k found ($TRANSFORMER_DATA_DIR, <repo>/shared/data, <repo>/../shared/data): "
            "the training, decoding and sdpa sections fail; copy the data folder next to the repo"
        )
    usable = f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}"
    check(sec, "device usable", not cuda or torch.cuda.is_available(), usable)
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


def model_overrides(ctx: Context, family: str) -> list[str]:
    """``transformer_tiny`` / ``llama_style_tiny`` (:data:`.presets.QUICK_DIMS` with ``--quick``), dropout 0."""
    name = "transformer_tiny" if family == "encoder-decoder" else "llama_style_tiny"
    return [f"model={name}", *(QUICK_DIMS[family] if ctx.args.quick else []), "model.dropout=0.0"]


def run_config(
    ctx: Context,
    name: str,
    family: str,
    precision: str,
    compile_on: bool,
    updates: int,
    device: str,
    own: list[str] | None = None,
) -> Any:
    """One run's typed config: ``own`` overrides (default the family's model of :func:`model_overrides`,
    ``train.max_tokens`` 4096, every update logged), then Multi30k en-de (with ``--quick`` the first
    :data:`QUICK_SLICE` pairs of it in ``<work>/corpus``, its data cache inside), then ``train``:
    ``updates`` updates, no time limit, no validation until the end, no BLEU, no checkpoints, no
    progress bar, seed 1, run folder ``<work>/runs/<name>``.

    Raises:
        RuntimeError: no Multi30k was found (``ctx.data_dir`` is None).
    """
    if ctx.data_dir is None:
        raise RuntimeError("no Multi30k data (set TRANSFORMER_DATA_DIR to the folder holding multi30k/)")
    q = ctx.args.quick
    if own is None:
        own = model_overrides(ctx, family) + [f"train.max_tokens={600 if q else 4096}", "train.log_every=1"]
        own += [f"optim.lr={3e-3 if q else 5e-3}", f"lr_scheduler.warmup_updates={4 if q else 100}"]
    # the default data cache (keyed by the training files' contents): results_gpu.sh's preprocessing
    # of multi30k_en_de after the check then finds it built
    data = ["data=multi30k_en_de", f"data.root={ctx.data_dir}", "data.test_splits=[test_2016_flickr]"]
    if q:
        data = excerpt_overrides(ctx.work / "corpus", 300)
        if not (ctx.work / "corpus" / "test_2016_flickr.de").is_file():  # the excerpt's last file: it is whole
            multi30k_excerpt(ctx.data_dir, ctx.work / "corpus", QUICK_SLICE)
    train = [f"train.max_updates={updates}", "train.max_time=0", "train.validate_every=0", "train.valid_bleu=false"]
    train += ["train.save_every=0", "train.progress=false", f"train.precision={precision}", f"train.device={device}"]
    train += [f"train.compile={str(compile_on).lower()}", "seed=1", f"run_dir={ctx.work / 'runs' / name}"]
    return compose_config(own + data + train)


def load_data(ctx: Context) -> Any:
    """The corpus (tokenizers and binarized splits), loaded once."""
    if ctx.data is None:
        cfg = run_config(ctx, "data", "encoder-decoder", "fp32", False, 1, "cpu")
        ctx.data = load_translation_data(cfg.data, log=None)
    return ctx.data


def fit_run(ctx: Context, cfg: Any) -> tuple[Any, dict[str, Any]]:
    """Train ``cfg`` with :meth:`Trainer.fit` on ``ctx.device`` (its metrics in the run folder's
    ``metrics.jsonl``, read back with :func:`~transformer.analysis.load_run`); the losses, speed, memory."""
    reset_peak(ctx.device)
    trainer = make_trainer(cfg, load_data(ctx), ctx.device)
    (Path(cfg.run_dir) / JsonlLogger.FILENAME).unlink(missing_ok=True)  # an earlier check's, in the same --work
    t = time.time()
    with JsonlLogger(cfg.run_dir) as sink:
        stop = trainer.fit(sink)
    wall = time.time() - t
    metrics = load_run(cfg.run_dir).metrics
    train = [r for r in metrics if r["split"] == "train"]
    rates = [r["tokens_per_s"] for r in train if "tokens_per_s" in r]
    later = rates[len(rates) // 2 :] or rates
    out = {
        "updates": trainer.update,
        "stop": stop,
        "precision": trainer.precision,
        "compile": cfg.train.compile,
        "losses": [r["loss"] for r in train],
        "valid_loss": next((r["loss"] for r in metrics if r["split"] == "valid"), None),
        "wall_s": wall,
        "first_update_s": train[0]["ntokens"] / train[0]["tokens_per_s"] if rates else None,
        "tokens_per_s_median_2nd_half": statistics.median(later) if later else None,
        "tokens_per_s_overall": trainer.state.train_tokens / max(trainer.state.train_time, 1e-9),
        "peak_memory_mb_by_phase": trainer.memory.as_dict(),
        "peak_mb": trainer.memory.as_dict().get("training"),
    }
    if ctx.device.type == "cuda":
        out["max_memory_allocated_mb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
    return trainer, out
