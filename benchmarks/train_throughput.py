"""Train-step throughput of our presets against same-dims peers; MFU, memory, scaling.

One command (from the repository root; peers come from the ``bench`` extra)::

    python -m benchmarks.train_throughput

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

* **throughput**: target tokens per second of one training step, for ours the trainer's own update
  (``Trainer.train_step``: loss scaled by the update's target tokens, gradient clipping, the
  GradScaler, the optimizer and the schedule; ``benchmarks/train_step.py``), for a peer zero_grad,
  forward, its loss, backward, optimizer step; for the 2017 encoder-decoder (``transformer_tiny``,
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
  ``transformer.training.job.allocator.tune_cpu_allocator`` (glibc ``mallopt``: freed large tensors
  stay in the heap instead of being unmapped and faulted in again every step) in every worker
  before its model is built; ``--malloc default`` leaves glibc as it is. Same for every model.
* **scaling**: our step time against sequence length (64 ... 1024, fixed 4096 tokens per batch)
  and against batch tokens (fixed length 32), tiny encoder-decoder (``--no-scaling`` to skip).
* **torch.compile**: our tiny rows with ``train.compile=true`` (the trainer's whole step compiled;
  ``--compile``; base rows too with ``--compile-base``); the first (compiling) step is reported
  separately (``compile_s``). The ``ours, unfused loss`` rows are our model and loss before the fused
  output layer + loss (full logits, then the loss) under the peers' hand-written step (ablation,
  ``--no-ablation`` to skip).
* **decoding**: the table of a ``benchmarks/decode_speed.py`` results file (``--decode <run>/decode_speed.json``).

The KV cache per token of each attention variant is ``benchmarks/kv_cache.py``'s table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO, git_commit, interleaved_rounds, module_command, prob, worker_result, write_report
from benchmarks.train_step import (
    DTYPES,
    PRESET_OVERRIDES,
    SIZES,
    SRC_LEN,
    TGT_LEN,
    flops_peak,
    preset,
    train_flops,
    worker,
)
from benchmarks.train_throughput_report import markdown
from transformer.precision import cpu_has_fast_bf16, cpu_model_name

# ----------------------------------------------------------------------------- one row per fresh process


def run_one(name: str, spec: dict[str, Any], tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``spec`` in a fresh worker process; a failed worker gives a skipped row with its reason."""
    spec = {**spec, "threads": args.threads, "malloc": args.malloc}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cmd = module_command("train_throughput", "--worker", json.dumps(spec))
    r, reason = worker_result(cmd, args.worker_timeout, env)
    if r is None:
        print(f"  {name}: skipped ({reason})", flush=True)
        return {"name": name, "skipped": reason, "spec": spec}
    r.update(tok_s=tokens / r["step_s"], name=name, spec=spec)
    print(
        f"  {name:<24s} {r['tok_s']:9.0f} tok/s  step {r['step_s'] * 1e3:7.1f} ms  mem +{r['mem_mb']:.0f} MiB",
        flush=True,
    )
    return r


def run_rounds(specs: dict[str, dict[str, Any]], tokens: int, args: argparse.Namespace, rounds: int) -> list[dict]:
    """Measure every spec (by name) in ``rounds`` interleaved rounds (:func:`benchmarks.interleaved_rounds`),
    one worker each: the reported step time is the median of its per-round medians (``round_step_s``
    keeps them all; a best-of estimator picked lucky fast periods in a trial run), memory the largest
    of its rounds, ``compile_s`` the first round's."""
    rows = interleaved_rounds(list(specs), rounds, lambda name: run_one(name, specs[name], tokens, args))
    out = []
    for name in specs:
        ok = [r for r in rows if r["name"] == name and "tok_s" in r]
        if not ok:
            out.append(next(r for r in rows if r["name"] == name))
            continue
        best = dict(sorted(ok, key=lambda r: r["step_s"])[(len(ok) - 1) // 2])  # the median round
        best.update(round_step_s=[r["step_s"] for r in ok], mem_mb=max(r["mem_mb"] for r in ok))
        if "compile_s" in ok[0]:
            best["compile_s"] = ok[0]["compile_s"]
        out.append(best)
    return out


# ----------------------------------------------------------------------------- sections


def bf16_skip_reason(args: argparse.Namespace, peaks: dict[str, float]) -> str:
    """Why bf16 rows are not run on this machine ("" when they are)."""
    if args.force_bf16 or args.device == "cuda" or cpu_has_fast_bf16():
        return ""
    return (
        f"no fast bf16 on this CPU ({cpu_model_name()}: no AMX / AVX512-BF16, torch capability "
        f"{torch.backends.cpu.get_cpu_capability()}); bf16 matmul {peaks['bf16'] / 1e9:.1f} GFLOP/s vs fp32 "
        f"{peaks['fp32'] / 1e9:.0f}; --force-bf16 runs them anyway"
    )


def throughput(args: argparse.Namespace, peaks: dict[str, float]) -> list[dict[str, Any]]:
    from benchmarks.peers import decoder_only_peers, encdec_peers

    rows_out = []
    several = len(args.precision) > 1
    skip_bf16 = bf16_skip_reason(args, peaks) if "bf16" in args.precision else ""
    device = args.device
    for size in args.sizes:
        ed_name, do_name, rows = SIZES[size]
        if device == "cuda":
            rows = args.cuda_rows
        for family, preset_name, peers in (
            ("encoder-decoder", ed_name, encdec_peers()),
            ("decoder-only", do_name, decoder_only_peers()),
        ):
            size_over = PRESET_OVERRIDES.get((size, family), [])
            cfg, _ = preset(preset_name, size_over)
            tokens = rows * TGT_LEN
            flops = train_flops(cfg, rows, SRC_LEN, TGT_LEN)
            print(
                f"[{size} {family}] {preset_name}, batch {rows}x{TGT_LEN}, {flops / rows / TGT_LEN / 1e6:.1f} "
                "MFLOP per target token",
                flush=True,
            )
            w, s = args.warmup, (args.steps if size == "tiny" else args.base_steps)
            specs, skipped = {}, []
            for prec in args.precision:
                tag = f" [{prec}]" if several else ""
                base = {
                    "preset": preset_name,
                    "rows": rows,
                    "src_len": SRC_LEN,
                    "tgt_len": TGT_LEN,
                    "warmup": w,
                    "steps": s,
                    "precision": prec,
                    "device": device,
                    "overrides": size_over,
                }
                # decoder-only peers have no dropout: our reference row gets none either
                ours_over = size_over + (["model.dropout=0.0"] if family == "decoder-only" else [])
                ours_spec = {**base, "model": "ours", "overrides": ours_over}
                these = [("ours" + tag, ours_spec)]
                if family == "decoder-only":
                    these.append((f"ours, preset dropout {prob(cfg.dropout)}{tag}", {**base, "model": "ours"}))
                if not args.no_ablation:  # before the fused output layer + loss: full logits, then the loss
                    these.append(("ours, unfused loss" + tag, {**ours_spec, "fused_loss": False}))
                if (args.compile or args.compile_base) and (size == "tiny" or args.compile_base):
                    these.append(("ours + torch.compile" + tag, {**ours_spec, "compile": True, "warmup": max(w, 3)}))
                if not args.no_peers:
                    these += [(pname + tag, {**base, "model": pname}) for pname in peers]
                if prec == "bf16" and skip_bf16:
                    skipped += [{"name": n, "skipped": skip_bf16, "spec": sp} for n, sp in these]
                else:
                    specs.update(these)
            results = run_rounds(specs, tokens, args, args.rounds if size == "tiny" else args.base_rounds)
            ours = {
                r["spec"]["precision"]: r
                for r in results
                if r["spec"]["model"] == "ours" and r["name"].split(" [")[0] == "ours"
            }
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
            rows_out.append(
                {
                    "size": size,
                    "family": family,
                    "preset": preset_name,
                    "batch": [rows, TGT_LEN],
                    "train_flops_per_step": flops,
                    "results": results + skipped,
                }
            )
    return rows_out


def scaling(args: argparse.Namespace, peak: float) -> dict[str, list[dict[str, Any]]]:
    name = "transformer_tiny"
    cfg, _ = preset(name)
    out: dict[str, list[dict[str, Any]]] = {"seq_len": [], "batch_tokens": []}
    points = [("seq_len", length, max(1, args.scaling_tokens // length)) for length in args.scaling_lengths]
    points += [("batch_tokens", 32, rows) for rows in args.scaling_rows]
    for key, length, rows in points:
        label = f"len {length} x {rows} rows" if key == "seq_len" else f"{rows} rows x len 32"
        spec = {
            "model": "ours",
            "preset": name,
            "rows": rows,
            "src_len": length,
            "tgt_len": length,
            "warmup": 1,
            "steps": args.scaling_steps,
            "device": args.device,
        }
        r = run_one(label, spec, rows * length, args)
        r.update(seq_len=length, rows=rows, batch_tokens=rows * length)
        if "step_s" in r:
            r["mfu"] = train_flops(cfg, rows, length, length) / r["step_s"] / peak
        out[key].append(r)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["tiny", "base"], choices=list(SIZES))
    p.add_argument(
        "--precision",
        nargs="+",
        default=["fp32", "bf16"],
        choices=list(DTYPES),
        help="precisions to measure every model at (bf16: autocast for ours and peers alike)",
    )
    p.add_argument(
        "--force-bf16",
        action="store_true",
        help="run bf16 rows even on a CPU without AMX / AVX512-BF16 (emulated, very slow)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: every row on the GPU (one fresh process each, torch.cuda.max_memory_allocated; "
        "MFU against the datasheet peak of DEVICE_PEAKS, or a matmul probe for an unknown GPU)",
    )
    p.add_argument("--cuda-rows", type=int, default=256, help="batch rows of every size on CUDA (x 24 target tokens)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="measured steps at tiny size (median reported)")
    p.add_argument("--base-steps", type=int, default=3, help="measured steps at base size")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--compile", action="store_true", help="add tiny rows with torch.compile on")
    p.add_argument("--compile-base", action="store_true", help="torch.compile rows at base size too")
    p.add_argument(
        "--malloc",
        choices=["tuned", "default"],
        default="tuned",
        help="glibc malloc in every worker: tune_cpu_allocator() (default) or as it is",
    )
    p.add_argument("--worker-timeout", type=float, default=3600, help="seconds before a model's process is given up")
    p.add_argument("--no-ablation", action="store_true", help="leave out the 'ours, unfused loss' row")
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--scaling-lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--scaling-tokens", type=int, default=4096)
    p.add_argument("--scaling-rows", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--scaling-steps", type=int, default=2)
    p.add_argument(
        "--rounds", type=int, default=5, help="interleaved measurements per model at tiny size (median round reported)"
    )
    p.add_argument("--base-rounds", type=int, default=3, help="interleaved measurements per model at base size")
    p.add_argument(
        "--decode",
        type=Path,
        default=None,
        metavar="JSON",
        help="add the table of a benchmarks/decode_speed.py results file (<run>/decode_speed.json)",
    )
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "train_throughput.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one model in this process (a JSON spec)
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available() and not args.worker:
        p.error(f"--device cuda: torch {torch.__version__} sees no CUDA device")

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    torch.set_num_threads(args.threads)
    start = time.time()
    precs = ("fp32", *[p for p in args.precision if p != "fp32"])
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")

    def probe() -> dict[str, float]:
        return {prec: flops_peak(dev, prec)[0] for prec in precs}

    peaks = probe()
    for prec, value in peaks.items():
        print(f"{prec} matmul peak: {value / 1e9:.1f} GFLOP/s ({gpu or f'{args.threads} threads'})", flush=True)
    peak = peaks["fp32"]
    commit = git_commit()
    res: dict[str, Any] = {
        "command": "python -m benchmarks.train_throughput " + " ".join(sys.argv[1:]),
        "rounds": args.rounds,
        "base_rounds": args.base_rounds,
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "precision": args.precision,
        "machine": {
            "cpu": cpu_model_name(),
            "gpu": gpu,
            "device": args.device,
            "threads": args.threads,
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_fast_bf16": cpu_has_fast_bf16(),
            "peaks_gflops": {k: v / 1e9 for k, v in peaks.items()},
            "peak_gflops": peak / 1e9,
            "malloc": args.malloc,
            "process_per_model": True,
        },
    }
    res["throughput"] = throughput(args, peaks)
    if not args.no_scaling:
        res["scaling"] = scaling(args, peak)
    if args.decode:
        res["decode"] = {"file": str(args.decode), **json.loads(args.decode.read_text())}
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
    write_report(args.out.parent, args.out.stem, res, markdown(res))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')} in {res['seconds']:.0f} s")


if __name__ == "__main__":
    main()
