"""The command line of the GPU check (``python -m benchmarks.gpu_check``) and the order its sections
run in; what each section does: ``docs/gpu.md`` ("The GPU check")."""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO, git_commit
from benchmarks.train_step import device_peak
from transformer.precision import cpu_model_name

from .context import Context, device_description, find_data_dir, section_environment
from .realistic import section_realistic
from .report import SECTIONS, Budget, OutOfTime, Report, Stopped, check, markdown, study_summary
from .sdpa import section_sdpa
from .trainer_rows import MODES as TRAINER_MODES
from .trainer_rows import section_trainer
from .training import section_decoding, section_training, section_training_compile

__all__ = [
    "SECTIONS",
    "Budget",
    "Context",
    "OutOfTime",
    "Report",
    "Stopped",
    "apply_defaults",
    "build_parser",
    "check",
    "device_peak",
    "main",
    "markdown",
    "study_summary",
]

# ----------------------------------------------------------------------------- main

RUN: dict[str, Callable[[dict[str, Any], Context, Report], None]] = {  # section: its function, in SECTIONS' order
    "environment": section_environment,
    "trainer": section_trainer,
    "training_compile": section_training_compile,
    "realistic": section_realistic,
    "training": section_training,
    "decoding": section_decoding,
    "sdpa": section_sdpa,
}
SECTION_NEED_S = {  # seconds a section's first piece of work needs on a GPU: less left, and it is skipped
    "trainer": 25,
    "training_compile": 90,
    "realistic": 12,
    "training": 30,
    "decoding": 10,
    "sdpa": 20,
}


CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
TOKENS, MODES = [16384, 8192, 32768], ["eager", "compiled", "cudagraphs"]
STARRED: dict[str, tuple[Any, Any, str, dict[str, Any]]] = {  # option: (default, --quick's, help, argparse's)
    "budget_s": (320.0, 0.0, "seconds for everything, 0: no limit", {"type": float}),
    "updates": (40, 8, "updates of the bf16 and compile runs", {"type": int}),
    "decode_updates": (300, 8, "updates of the fp32 run, the decoding model", {"type": int}),
    "trainer_tokens": (16384, 1024, "trainer section: train.max_tokens", {"type": int}),
    "trainer_vocab": (32000, 0, "trainer section: the model's vocabulary, 0: the data's own", {"type": int}),
    "trainer_warmup": (5, 1, "trainer warm-up updates after the first", {"type": int}),
    "trainer_updates": (30, 2, "trainer updates timed together", {"type": int}),
    "cpu_ref_steps": (3, 2, "updates of each CPU reference", {"type": int}),
    "realistic_tokens": (TOKENS, [256], "realistic: max tokens per batch, first first", {"nargs": "+", "type": int}),
    "realistic_modes": (MODES, MODES[:2], "realistic: modes (cudagraphs: CUDA)", {"nargs": "+", "choices": MODES}),
    "realistic_vocab": (32000, 300, "realistic section: vocabulary", {"type": int}),
    "realistic_warmup": (3, 1, "realistic warm-up steps", {"type": int}),
    "realistic_steps": (10, 2, "realistic measured steps, median", {"type": int}),
    "realistic_sentences": (1000, 48, "sentences decoded", {"type": int}),
    "decode_batch": (64, 16, "sentences per decoding batch", {"type": int}),
    "realistic_budget_s": (240.0, 0.0, "seconds for the realistic section, 0: no limit of its own", {"type": float}),
    "threads": (CORES, 1, "torch CPU threads", {"type": int}),
}


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else f"{value:g}"


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--quick`` changes the defaults of :data:`STARRED`, marked * in the help)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--device", choices=["cuda", "cpu"], default="cuda")
    add("--quick", action="store_true", help="tiny sizes and few steps: the CPU smoke mode (seconds)")
    add("--out", type=Path, help="results folder (default docs/benchmarks/gpu/ on cuda, runs/gpu_check_cpu/ on cpu)")
    work = REPO / "runs" / "gpu_check_work"
    add("--work", type=Path, default=work, help="checkpoints, data cache, smoke corpus (not results)")
    for name, (normal, quick, what, kwargs) in STARRED.items():
        help_ = f"* {what} ({_shown(normal)}; --quick {_shown(quick)})"
        add("--" + name.replace("_", "-"), default=None, help=help_, **kwargs)
    add("--skip", nargs="*", default=[], choices=list(SECTIONS[1:]), help="sections recorded as skipped")
    add(
        "--compile-precision",
        nargs="+",
        default=["bf16", "fp32"],
        choices=["fp32", "bf16"],
        help="precisions of the training_compile section, in order (bf16 first: what train.precision=auto trains)",
    )
    add("--trainer-model", default="base", choices=["base", "big"], help="trainer section: model (presets.py)")
    add(
        "--trainer-modes",
        nargs="+",
        default=["eager", "compiled", "ddp"],
        choices=list(TRAINER_MODES),
        help="trainer section: rows, in order (ddp: DDP over a 1-rank process group)",
    )
    add("--trainer-mean-len", type=float, default=27.0, help="trainer section: mean target length of the joined pairs")
    add("--sentences", type=int, default=50, help="test sentences of the decoding check")
    add("--encdec-peers", nargs="*", default=["HF Marian"], help="encoder-decoder peers (benchmarks/peers.py)")
    add("--decoder-peers", nargs="*", default=["HF Llama"], help="decoder-only peers")
    models = ["base", "big", "llama100m"]
    add("--realistic-models", nargs="+", default=models, choices=models, help="realistic section: models (presets.py)")
    add(
        "--study-summary",
        type=Path,
        metavar="RUNS_DIR",
        help="summarise a results_gpu.sh study's run folders into --out instead",
    )
    add("--study-note", default="", help="a sentence for the study summary (time cap, ...)")
    return p


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options of :data:`STARRED` from ``--quick``, and ``--out`` from ``--device``."""
    for name, (normal, quick, _, _) in STARRED.items():
        if getattr(args, name) is None:
            value = quick if args.quick else normal
            setattr(args, name, list(value) if isinstance(value, list) else value)  # a run's own list
    if args.out is None:
        args.out = REPO / "docs" / "benchmarks" / "gpu" if args.device == "cuda" else REPO / "runs" / "gpu_check_cpu"
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the sections in :data:`SECTIONS`' order; 0 when every section passed or was skipped, else 1."""
    args = apply_defaults(build_parser().parse_args(argv))
    if args.study_summary is not None:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU {cpu_model_name()}"
        study_summary(args.study_summary, args.out, name, args.study_note)
        return 0
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_check: --device cuda but torch {torch.__version__} sees no CUDA device "
            f"(torch.version.cuda={torch.version.cuda})",
            file=sys.stderr,
        )
    device = (
        torch.device("cuda", 0) if args.device == "cuda" and torch.cuda.is_available() else torch.device(args.device)
    )
    desc = (
        device_description(device)
        if device.type == "cpu" or torch.cuda.is_available()
        else {"device": "cuda", "device_name": "no CUDA device"}
    )
    meta = {
        "command": "python -m benchmarks.gpu_check " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "quick": args.quick,
        "budget_s": args.budget_s,
        **desc,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    report = Report(args.out, meta)
    ctx = Context(args=args, device=device, budget=Budget(args.budget_s), data_dir=find_data_dir(), work=args.work)
    report.data["skipped_for_time"] = ctx.budget.skipped  # the same list: every budget refusal, as it happens
    ctx.meta_device = desc["device_name"]
    args.work.mkdir(parents=True, exist_ok=True)

    def on_term(signum: int, frame: Any) -> None:
        raise Stopped(f"stopped by signal {signal.Signals(signum).name} (a time cap) during this section")

    signal.signal(signal.SIGTERM, on_term)
    report.write()
    stopped = None
    for name in SECTIONS:
        if stopped:
            report.skip(name, stopped)
        elif name in args.skip:
            report.skip(name, "--skip")
        elif device.type == "cuda" and not torch.cuda.is_available() and name != "environment":
            report.skip(name, "no CUDA device")
        else:
            try:
                ctx.budget.need(SECTION_NEED_S.get(name, 0), name)
                report.run(name, lambda sec, fn=RUN[name]: fn(sec, ctx, report))
            except OutOfTime as err:
                report.skip(name, f"time budget: {err}")
            except Stopped as err:
                stopped = f"not run: {err}"
    statuses = {n: s["status"] for n, s in report.data["sections"].items()}
    print(f"gpu_check: {statuses}; wrote {args.out / 'gpu_check.json'} and gpu_check.md", file=sys.stderr)
    return 0 if all(s in ("passed", "skipped") for s in statuses.values()) else 1
