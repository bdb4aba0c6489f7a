"""Training throughput of our mixture-of-experts decoder-only model against HF ``MixtralForCausalLM``
at the same dims, in one process, on the same batch.

One command (from the repository root; transformers comes with the ``bench`` extra)::

    python -m benchmarks.moe_throughput                 # llama_style_tiny + model/ffn=moe, 8 experts, top-2
    python -m benchmarks.moe_throughput --quick         # a smoke run: 2 layers, 8 rows, 1 round of 2 steps

prints a Markdown table (target tokens/s of a training step; median of ``--steps`` steps after
``--warmup``, then the median over ``--rounds`` interleaved rounds) with ratios against our default
dispatch, and writes the rows as JSON with ``--out``. Unlike ``train_throughput.py`` every model lives in this
process (same batch tensors, same thread count); peak memory is therefore not reported.

Rows:

* ``ours`` (``F.grouped_mm`` dispatch on CPU) and ``ours, loop dispatch`` (a loop over the experts):
  the trainer's own update (``Trainer.train_step``): the fused output layer + label-smoothed cross
  entropy + the weighted router losses over the update's target tokens, clipping, the Adam step,
  the schedule and the router's bias update.
* ``HF Mixtral (<experts_implementation>)`` for HF's dispatches (``grouped_mm``, ``eager``: a loop
  over the experts that received tokens, ``batched_mm``): zero_grad, HF's own loss (cross entropy +
  ``router_aux_loss_coef * load_balancing_loss_func``), backward, the Adam step.

Same dims: d_model, layers, heads, key/value heads, vocabulary (8000), experts, top-k, expert
width (our GLU-sized ``ffn_hidden`` is Mixtral's ``intermediate_size``), no biases, untied output,
no dropout (Mixtral has none: ours runs with ``model.dropout=0``), the same Adam (our builder's).
Do not run it for timing beside other heavy processes: a shared machine's speed drifts.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks import interleaved_rounds, peers
from benchmarks.train_step import (
    VOCAB,
    as_batch,
    hand_step,
    make_batch,
    make_optimizer,
    preset,
    time_steps,
    trainer_under_test,
)
from transformer.analysis.markdown import cell, table
from transformer.config import model_sizes
from transformer.models import count_parameters, moe_blocks


def moe_dims(cfg: Any) -> dict[str, Any]:
    """The sizes :class:`peers.HFMixtralPeer` needs to match our config."""
    sizes = model_sizes(cfg)
    return {
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "n_kv_heads": sizes.n_kv_heads,
        "ffn_hidden": sizes.ffn_hidden,
        "dec_layers": cfg.n_encoder_layers + cfg.n_decoder_layers,
        "experts": sizes.n_experts,
        "top_k": sizes.top_k,
        "aux_coef": cfg.ffn.router_aux_loss_coef,
        "norm_eps": cfg.norm.eps,
        "rope_theta": cfg.position.rope_theta,
    }


def build_rows(args: argparse.Namespace, batch: dict[str, torch.Tensor]) -> tuple[Any, dict[str, tuple]]:
    """Our model config, and ``{name: (step, model)}`` of every model measured."""
    overrides = [
        "model/ffn=moe",
        "model.dropout=0.0",
        f"model.ffn.n_experts={args.experts}",
        f"model.ffn.top_k={args.top_k}",
        *([f"model.n_decoder_layers={args.layers}"] if args.layers else []),
        *args.override,
    ]
    cfg, optim_cfg = preset(args.preset, overrides)
    if cfg.arch != "decoder_only":
        raise SystemExit(f"--preset {args.preset} is not decoder-only (MixtralForCausalLM is)")
    rows = {}
    for name, dispatch in (("ours", "auto"), ("ours, loop dispatch", "loop")):
        torch.manual_seed(0)
        trainer = trainer_under_test({"preset": args.preset, "overrides": overrides}, batch, torch.device("cpu"))
        for block in moe_blocks(trainer.model):
            block.experts.dispatch = dispatch
        rows[name] = (functools.partial(trainer.train_step, [as_batch(batch)]), trainer.model)
    if not args.no_peers:
        try:
            peers.preload("HF Mixtral")
        except ImportError as err:
            print(f"HF Mixtral skipped: {err}", flush=True)
            return cfg, rows
        for impl in args.hf_experts:
            torch.manual_seed(0)
            model = peers.HFMixtralPeer(moe_dims(cfg), VOCAB, impl)
            rows[f"HF Mixtral ({impl})"] = (hand_step(model, batch, make_optimizer(model, optim_cfg)), model.core)
    return cfg, rows


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure every row in interleaved rounds; print and return the rows."""
    torch.set_num_threads(args.threads)
    batch = make_batch("decoder_only", args.rows, args.src_len, args.tgt_len)
    tokens = args.rows * args.tgt_len  # target tokens per step (the loss positions), the same for every model
    cfg, models = build_rows(args, batch)

    def measure(name: str) -> dict[str, Any]:
        step_s = time_steps(models[name][0], args.warmup, args.steps)["step_s"]
        print(f"  {name}: {step_s * 1e3:.0f} ms", flush=True)
        return {"name": name, "step_s": step_s}

    rounds = interleaved_rounds(list(models), args.rounds, measure)
    out = []
    for name, (_, model) in models.items():
        per_round = [r["step_s"] for r in rounds if r["name"] == name]
        step_s = statistics.median(per_round)
        out.append(
            {
                "name": name,
                "tok_s": tokens / step_s,
                "step_s": step_s,
                "round_step_s": per_round,
                "params": count_parameters(model),
                "active_params": count_parameters(model, active_only=True) if name.startswith("ours") else None,
            }
        )
    for r in out:
        r["ratio"] = r["tok_s"] / out[0]["tok_s"]
    print(
        f"\n{args.preset} + model/ffn=moe: {cfg.n_encoder_layers + cfg.n_decoder_layers} layers, d_model {cfg.d_model}, "
        f"{args.experts} experts (top-{args.top_k}, width {model_sizes(cfg).ffn_hidden}), batch {args.rows} x "
        f"({args.src_len} + {args.tgt_len}) tokens, {args.threads} threads, fp32\n"
    )
    cells = [
        [
            r["name"],
            cell(r["tok_s"], "{:,.0f}"),
            cell(r["step_s"] * 1e3, "{:.1f}"),
            cell(r["ratio"], "{:.2f}x"),
            f"{r['params']:,}" + (f" ({r['active_params']:,})" if r["active_params"] else ""),
        ]
        for r in out
    ]
    print("\n".join(table(["model", "target tok/s", "step ms", "vs ours", "params (active)"], "lrrrr", cells)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="llama_style_tiny", help="a decoder-only model preset (configs/model/)")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--layers", type=int, default=0, help="decoder layers (0: the preset's)")
    p.add_argument(
        "--override", nargs="*", default=[], help="more Hydra overrides of the model, e.g. model.ffn.n_shared_experts=1"
    )
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--tgt-len", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hf-experts", nargs="+", default=["grouped_mm", "eager"], help="HF experts_implementation rows")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 layers, 8 rows, 1 warmup, 2 steps, 1 round")
    p.add_argument("--out", type=Path, default=None, metavar="JSON")
    args = p.parse_args()
    if args.quick:
        args.layers, args.rows, args.warmup, args.steps, args.rounds = 2, 8, 1, 2, 1
    rows = run(args)
    if args.out is not None:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
