"""Profile one training step of our model or a peer with ``torch.profiler`` (the table behind docs/benchmarks).

Example (from the repository root; peers need the ``bench`` extra)::

    python -m benchmarks.profile_step --model ours --preset transformer_tiny
    python -m benchmarks.profile_step --model "HF Marian" --preset transformer_tiny
    python -m benchmarks.profile_step --model ours --preset llama_style_tiny model.dropout=0.0

Same batch, step (ours: ``Trainer.train_step``), optimizer, threads and allocator setting as
``benchmarks/train_throughput.py``: the median step time of ``--steps`` steps, then the operators of ``--profile-steps`` steps sorted by
their own CPU time (``--row-limit`` rows).
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import peers
from benchmarks.train_step import SIZES, SRC_LEN, TGT_LEN, model_under_test, time_steps
from transformer.training.job.allocator import tune_cpu_allocator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="ours", help="'ours' or a peer name from benchmarks/peers.py")
    p.add_argument("--preset", default="transformer_tiny", help="model preset (configs/model/) giving the dims")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the preset (ours only), e.g. model.dropout=0.0")
    p.add_argument("--rows", type=int, default=0, help="batch rows (default: the benchmark's for the preset)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--malloc", choices=["tuned", "default"], default="tuned")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--row-limit", type=int, default=25)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    if args.malloc == "tuned":
        tune_cpu_allocator()
    rows = args.rows or next((r for ed, do, r in SIZES.values() if args.preset in (ed, do)), 96)
    spec = {"model": args.model, "preset": args.preset, "overrides": args.overrides}
    cfg, _, build = model_under_test({**spec, "rows": rows, "src_len": SRC_LEN, "tgt_len": TGT_LEN})
    table = peers.encdec_peers() if cfg.arch == "encoder_decoder" else peers.decoder_only_peers()
    if args.model != "ours" and args.model not in table:
        raise SystemExit(f"--model {args.model!r} is not 'ours' or one of {sorted(table)}")
    step, _ = build(torch.device("cpu"))
    median = time_steps(step, warmup=2, steps=args.steps)["step_s"]
    print(
        f"{args.model} {args.preset} {rows}x{TGT_LEN}: median step {median * 1e3:.1f} ms, "
        f"{rows * TGT_LEN / median:,.0f} target tok/s ({args.threads} threads, malloc {args.malloc})"
    )
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        time_steps(step, warmup=0, steps=args.profile_steps)
    print(f"operators over {args.profile_steps} steps (self CPU time):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.row_limit))


if __name__ == "__main__":
    main()
