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
  bf16 peak (H200: 989 TFLOP/s; :data:`train_step.DEVICE_PEAKS`, else a matmul probe) and
  against the row's dtype peak, peak memory (``torch.cuda.max_memory_allocated``).
* ``training_compile``: the training check with ``train.compile=true`` (fp32 and bf16), last because
  compiling is the slowest and least predictable part; the first update's time includes the first
  compile (a later batch shape recompiles once, with dynamic shapes).

The whole check keeps to ``--budget-s`` (GPU default 390 s): a run or row that would start past it
is recorded as skipped for the time budget. SIGTERM (``timeout``) records the section in progress
as failed and stops.

``--study-summary RUNS_DIR`` (used by ``scripts/gpu_check.sh``) instead summarises the run folders
of a ``scripts/results_gpu.sh`` study (updates reached, tokens/s, BLEU) into ``--out``.

Where the code is (modules beside this file, which puts the repository and ``benchmarks/`` on
``sys.path`` for them): ``gpu_check_report.py`` (the two files, the sections' status and checks, the
time budget, the study summary), ``gpu_check_context.py`` (the ``environment`` section and what
the sections share: the context, the runs' configs, one training run), ``gpu_check_training.py``
(``training``, ``training_compile``, ``decoding``), ``gpu_check_sdpa.py`` and
``gpu_check_throughput.py`` (on ``train_step.py``'s machinery); this file holds the command line and
the order the sections run in.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

REQUIRED = {  # module: distribution (what pip install -e . brings)
    "torch": "torch", "numpy": "numpy", "hydra": "hydra-core", "omegaconf": "omegaconf", "einops": "einops",
    "sentencepiece": "sentencepiece", "sacrebleu": "sacrebleu", "safetensors": "safetensors", "tqdm": "tqdm",
}


def missing_packages() -> list[str]:
    """``module (distribution)`` for every required module that cannot be imported here."""
    return [f"{m} ({d})" for m, d in REQUIRED.items() if importlib.util.find_spec(m) is None]


if __name__ == "__main__" and missing_packages() and "--study-summary" not in sys.argv:
    print("gpu_check: missing packages: " + ", ".join(missing_packages()) + f" (python {sys.executable}); "
          "install the project first: pip install -e . (and transformers for the HF rows)", file=sys.stderr)
    sys.exit(2)

import torch  # noqa: E402

from gpu_check_context import OPTIONAL, Context, device_description, find_data_dir, section_environment  # noqa: E402,F401
from gpu_check_report import (  # noqa: E402
    SECTIONS, Budget, OutOfTime, Report, Stopped, check, git_commit, markdown, study_summary,
)
from gpu_check_sdpa import section_sdpa  # noqa: E402
from gpu_check_throughput import section_throughput  # noqa: E402
from gpu_check_training import section_decoding, section_training, section_training_compile  # noqa: E402
from train_step import device_peak  # noqa: E402
from transformer.training.precision import cpu_model_name  # noqa: E402

__all__ = ["OPTIONAL", "REQUIRED", "SECTIONS", "Budget", "Context", "OutOfTime", "Report", "Stopped", "apply_defaults",
           "build_parser", "check", "device_peak", "main", "markdown", "missing_packages", "study_summary"]

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
