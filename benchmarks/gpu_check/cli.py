"""The command line of the GPU check (``python -m benchmarks.gpu_check``): its options, the sections in
the order they run (what each does: ``docs/gpu.md``, "The GPU check"), and the summary of a
``results_gpu.sh`` study (``--study-summary``)."""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO, git_commit, write_report
from transformer.analysis import find_run_dirs, load_run
from transformer.analysis.markdown import cell
from transformer.precision import cpu_model_name

from .context import Context, device_description, find_data_dir, section_environment
from .realistic import section_realistic
from .report import SECTIONS, Budget, Column, Report, Stopped, columns
from .sdpa import section_sdpa
from .trainer_rows import MODES as TRAINER_MODES
from .trainer_rows import section_trainer
from .training import section_decoding, section_training, section_training_compile

RUN = {  # section: its function, in SECTIONS' order
    "environment": section_environment,
    "trainer": section_trainer,
    "training_compile": section_training_compile,
    "realistic": section_realistic,
    "training": section_training,
    "decoding": section_decoding,
    "sdpa": section_sdpa,
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
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
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
    precisions = ["bf16", "fp32"]
    add("--compile-precision", nargs="+", default=precisions, choices=precisions, help="training_compile's, in order")
    add("--trainer-model", default="base", choices=["base", "big"], help="trainer section: model (presets.py)")
    modes = ["eager", "compiled", "ddp"]
    add("--trainer-modes", nargs="+", default=modes, choices=TRAINER_MODES, help="trainer section: rows, in order")
    add("--trainer-mean-len", type=float, default=27.0, help="trainer section: mean target length of the joined pairs")
    add("--sentences", type=int, default=50, help="test sentences of the decoding check")
    add("--encdec-peers", nargs="*", default=["HF Marian"], help="encoder-decoder peers (benchmarks/peers.py)")
    add("--decoder-peers", nargs="*", default=["HF Llama"], help="decoder-only peers")
    models = ["base", "big", "llama100m"]
    add("--realistic-models", nargs="+", default=models, choices=models, help="realistic section: models (presets.py)")
    add("--study-summary", type=Path, metavar="RUNS_DIR", help="summarise a study's run folders into --out instead")
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
    """Run the sections in :data:`SECTIONS`' order; 0 when every section passed or was skipped, else 1;
    2 without writing anything for ``--device cuda`` on a machine without one and no ``--out``."""
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available() and args.out is None and args.study_summary is None:
        print(
            f"gpu_check: --device cuda but torch {torch.__version__} sees no CUDA device; nothing written "
            "(the default --out holds the recorded GPU results: give --out to record this machine's check)",
            file=sys.stderr,
        )
        return 2
    args = apply_defaults(args)
    if args.study_summary is not None:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU {cpu_model_name()}"
        study_summary(args.study_summary, args.out, name, args.study_note)
        return 0
    torch.set_num_threads(args.threads)
    cuda, no_cuda = args.device == "cuda", args.device == "cuda" and not torch.cuda.is_available()
    if no_cuda:
        print(f"gpu_check: --device cuda but torch {torch.__version__} sees no CUDA device", file=sys.stderr)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    desc = {"device": "cuda", "device_name": "no CUDA device"} if no_cuda else device_description(device)
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
    args.work.mkdir(parents=True, exist_ok=True)

    def on_term(signum: int, frame: Any) -> None:
        raise Stopped(f"stopped by signal {signal.Signals(signum).name} (a time cap) during this section")

    signal.signal(signal.SIGTERM, on_term)
    stopped = None
    for name in SECTIONS:
        if stopped or name in args.skip or (no_cuda and name != "environment"):
            report.start(name, "skipped", reason=stopped or ("--skip" if name in args.skip else "no CUDA device"))
            continue
        try:
            report.run(name, lambda sec, fn=RUN[name]: fn(sec, ctx, report))
        except Stopped as err:
            stopped = f"not run: {err}"
    statuses = {n: s["status"] for n, s in report.data["sections"].items()}
    print(f"gpu_check: {statuses}; wrote {args.out / 'gpu_check.json'} and gpu_check.md", file=sys.stderr)
    return 0 if all(s in ("passed", "skipped") for s in statuses.values()) else 1


STUDY: list[Column] = [
    ("run", "run", "{}"),
    ("device", "device", "{}"),
    ("precision", "precision", "{}"),
    ("updates / budget", "updates", "{}"),
    ("train tok/s (last window)", "tokens_per_s", "{:,.0f}"),
    ("last valid (update: loss / BLEU)", "last_valid", "{}"),
    ("finished", "finished", "{}"),
    ("test BLEU", "test_bleu", "{:.2f}"),
]


def study_summary(runs_dir: Path, out: Path, device_name: str, note: str) -> dict[str, Any]:
    """How far a ``results_gpu.sh`` study's runs got (``scripts/compare.py`` needs finished runs): per
    run folder with metrics (:func:`~transformer.analysis.load_run`), the updates reached of its
    budget, the last tokens/s and validation, test BLEU once finished, the device its ``results.json``
    records; written to ``out/study_progress.{json,md}``, titled by the finished runs' GPUs, else
    ``device_name``."""
    rows, gpus = [], set()
    for run in map(load_run, find_run_dirs(runs_dir) if runs_dir.is_dir() else []):
        if not run.metrics:  # a folder that never logged is no row
            continue
        train = [x for x in run.metrics if x.get("split") == "train"] or [{"update": 0}]
        valid = [x for x in run.metrics if x.get("split") == "valid"]
        done, cfg = run.results or {}, (run.config or {}).get("train") or {}
        gpu, device = (done.get("hardware") or {}).get("gpu"), done.get("device") or cfg.get("device")
        gpus |= {gpu} if gpu else set()
        v = valid[-1] if valid else None
        rows.append(
            {
                "run": run.run_dir.relative_to(runs_dir).as_posix(),
                "device": f"{device} ({gpu})" if gpu and str(device).startswith("cuda") else device,
                "precision": done.get("precision") or cfg.get("precision"),
                "updates": f"{train[-1]['update']} / {cfg.get('max_updates')}",
                "tokens_per_s": train[-1].get("tokens_per_s"),
                "last_valid": v and f"{v['update']}: {v['loss']:.3f} / {cell(v.get('bleu'), '{:.2f}') or '-'}",
                "finished": run.results is not None,
                "test_bleu": done.get("bleu"),
            }
        )
    res = {
        "device_name": " + ".join(sorted(gpus)) or device_name,
        "note": note,
        "runs_dir": str(runs_dir),
        "runs": rows,
    }
    res.update(date=datetime.date.today().isoformat(), commit=git_commit())
    lines = [f"# results_gpu.sh study on {res['device_name']}: progress", "", f"{note}  "]
    lines += [
        f"Date {res['date']}, commit `{res['commit']}`; runs in `{runs_dir}`, precision as each run's config says."
    ]
    write_report(out, "study_progress", res, "\n".join([*lines, "", *columns(STUDY, rows)]) + "\n")
    return res
