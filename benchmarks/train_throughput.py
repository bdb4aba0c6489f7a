"""Train-step throughput of our presets against same-dims peers; MFU, memory, KV cache, scaling.

One command (from the repository root; peers come from the ``bench`` extra)::

    flock /tmp/cpu_heavy.lock python benchmarks/train_throughput.py

prints a Markdown table and writes ``docs/benchmarks/train_throughput.json`` (and ``.md``).

What is measured (fp32, ``--threads`` intra-op threads, synthetic uniform tokens, no padding):

* **throughput**: target tokens per second of one training step (zero_grad, forward, loss,
  backward, optimizer step), for the 2017 encoder-decoder (``transformer_tiny``,
  ``transformer_2017_base``) and the Llama-style decoder-only (``llama_style_tiny``,
  ``llama_style``) presets, side by side with ``torch.nn.Transformer``, HF Marian and BART, HF
  Llama and x-transformers at the same dims, batch shape (``B x 24`` target tokens; decoder-only
  rows are ``24`` source + ``24`` target tokens) and vocabulary. Every model gets the same
  optimizer (Adam, the implementation our builder picks). Ratios are peer / ours.
* **MFU**: ``3 x forward FLOPs`` (``transformer.models.flops.forward_flops``, counting the output
  layer only where a loss is taken) per step over the step time, divided by the fp32 matmul peak
  measured in the same run (best of square ``torch.mm``).
* **memory**: peak resident-set growth of the process during the measured steps of each model
  (CPU; ``torch.cuda.max_memory_allocated`` on GPU).
* **KV cache**: bytes per generated token for MHA, GQA and MQA at Llama base dims.
* **scaling**: our step time against sequence length (64 ... 1024, fixed 4096 tokens per batch)
  and against batch tokens (fixed length 32), tiny encoder-decoder.
* **torch.compile**: our tiny rows with ``torch.compile`` on the layers (``--compile``); the
  ``ours, unfused loss`` rows are the code before the fused output layer + loss (ablation).
* **decoding**: the row of ``benchmarks/decode_speed.py`` when that file exists (``--decode``).
"""

from __future__ import annotations

import argparse
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
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from transformer.models import build_model  # noqa: E402
from transformer.models.flops import forward_flops, kv_cache_bytes_per_token  # noqa: E402
from transformer.modules.ffn import glu_hidden_size  # noqa: E402
from transformer.training.criterion import LabelSmoothedCrossEntropy, model_loss  # noqa: E402
from transformer.training.optim import build_optimizer  # noqa: E402

VOCAB = 8000
SRC_LEN = TGT_LEN = 24
LABEL_SMOOTHING = 0.1
SIZES = {
    # size: (enc-dec preset, decoder-only preset, batch rows)
    "tiny": ("transformer_tiny", "llama_style_tiny", 96),
    "base": ("transformer_2017_base", "llama_style", 48),
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


def time_steps(model: torch.nn.Module, batch: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
               warmup: int, steps: int) -> dict[str, float]:
    """Median step time (s) of ``steps`` steps after ``warmup``; peak memory growth (MiB)."""
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = model.step_loss(batch)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    gc.collect()
    base = _rss_mb()
    peak = base
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
        peak = max(peak, _rss_mb())
    times.sort()
    return {"step_s": times[len(times) // 2], "best_s": times[0], "mem_mb": peak}


def make_optimizer(model: torch.nn.Module, optim_cfg: Any) -> torch.optim.Optimizer:
    """Our builder's Adam for every model under test (same implementation for all)."""
    return build_optimizer(model, optim_cfg, "cpu")


def run_one(name: str, ctor: Callable[[], torch.nn.Module], optim_cfg: Any, batch: dict[str, torch.Tensor],
            warmup: int, steps: int, tokens: int) -> dict[str, Any]:
    torch.manual_seed(0)
    gc.collect()
    before = _rss_mb()
    try:
        model = ctor()
    except ImportError as err:  # a peer's package is not installed
        print(f"  {name}: skipped ({err})", flush=True)
        return {"name": name, "skipped": str(err)}
    opt = make_optimizer(model, optim_cfg)
    r = time_steps(model, batch, opt, warmup, steps)
    r["mem_mb"] = r["mem_mb"] - before
    r["tok_s"] = tokens / r["step_s"]
    r["name"] = name
    print(f"  {name:<24s} {r['tok_s']:9.0f} tok/s  step {r['step_s'] * 1e3:7.1f} ms  mem +{r['mem_mb']:.0f} MiB", flush=True)
    del model, opt
    gc.collect()
    return r


# ----------------------------------------------------------------------------- machine peak


def matmul_peak(reps: int = 5) -> float:
    """Best fp32 ``torch.mm`` rate (FLOP/s) over square sizes and the base model's FFN shape.

    One 2048^3 product alone under-reads the peak on some machine states (the base rows then show
    MFU > 100%), so the best over several shapes is taken.
    """
    best_rate = 0.0
    for m, k, n in ((1024, 1024, 1024), (2048, 2048, 2048), (1152, 512, 2048), (1152, 2048, 512)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        for _ in range(reps):
            t = time.perf_counter()
            torch.mm(a, b)
            best_rate = max(best_rate, 2 * m * k * n / (time.perf_counter() - t))
    return best_rate


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# ----------------------------------------------------------------------------- sections


def throughput(args: argparse.Namespace, peak: float) -> list[dict[str, Any]]:
    from peers import decoder_only_peers, encdec_peers

    rows_out = []
    for size in args.sizes:
        ed_name, do_name, rows = SIZES[size]
        for family, preset_name, peers in (
            ("encoder-decoder", ed_name, encdec_peers()), ("decoder-only", do_name, decoder_only_peers()),
        ):
            cfg, optim_cfg = preset(preset_name)
            batch = make_batch(cfg.arch, rows, SRC_LEN, TGT_LEN)
            tokens = rows * TGT_LEN
            flops = train_flops(cfg, rows, SRC_LEN, TGT_LEN)
            print(f"[{size} {family}] {preset_name}, batch {rows}x{TGT_LEN}, {flops / rows / TGT_LEN / 1e6:.1f} "
                  "MFLOP per target token", flush=True)
            w, s = args.warmup, (args.steps if size == "tiny" else args.base_steps)
            ours = run_one("ours", lambda: Ours(cfg), optim_cfg, batch, w, s, tokens)
            results = [ours]
            if not args.no_ablation:  # before the fused output layer + loss: full logits, then the loss
                results.append(run_one("ours, unfused loss", lambda: Ours(cfg, fused_loss=False), optim_cfg,
                                       batch, w, s, tokens))
            if args.compile and size == "tiny":
                results.append(run_one("ours + torch.compile", lambda: Ours(cfg, compile_model=True), optim_cfg,
                                       batch, max(w, 3), s, tokens))
            if not args.no_peers:
                d = dims(cfg)
                for pname, pctor in peers.items():
                    results.append(run_one(pname, lambda pctor=pctor: pctor(d, VOCAB), optim_cfg, batch, w, s, tokens))
            for r in results:
                if "tok_s" in r:
                    r["ratio_to_ours"] = r["tok_s"] / ours["tok_s"]
                    r["mfu"] = flops / r["step_s"] / peak
            rows_out.append({"size": size, "family": family, "preset": preset_name, "batch": [rows, TGT_LEN],
                             "train_flops_per_step": flops, "results": results})
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
    cfg, optim_cfg = preset("transformer_tiny")
    out: dict[str, list[dict[str, Any]]] = {"seq_len": [], "batch_tokens": []}
    for length in args.scaling_lengths:
        rows = max(1, args.scaling_tokens // length)
        batch = make_batch(cfg.arch, rows, length, length)
        r = run_one(f"len {length} x {rows} rows", lambda: Ours(cfg), optim_cfg, batch, 1, args.scaling_steps,
                    rows * length)
        r.update(seq_len=length, rows=rows, mfu=train_flops(cfg, rows, length, length) / r["step_s"] / peak)
        out["seq_len"].append(r)
    for rows in args.scaling_rows:
        batch = make_batch(cfg.arch, rows, 32, 32)
        r = run_one(f"{rows} rows x len 32", lambda: Ours(cfg), optim_cfg, batch, 1, args.scaling_steps, rows * 32)
        r.update(seq_len=32, rows=rows, batch_tokens=rows * 32, mfu=train_flops(cfg, rows, 32, 32) / r["step_s"] / peak)
        out["batch_tokens"].append(r)
    return out


def decode_row() -> dict[str, Any] | None:
    path = REPO / "benchmarks" / "decode_speed.py"
    if not path.exists():
        return None
    try:
        proc = subprocess.run([sys.executable, str(path), "--json"], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as err:  # noqa: BLE001 - an optional row; report why it is missing
        return {"skipped": repr(err)}


# ----------------------------------------------------------------------------- report


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        "# Train-step throughput against peers",
        "",
        f"Command: `{res['command']}`  ",
        f"Date: {res['date']}; commit `{res['commit']}`  ",
        f"Machine: {m['cpu']}, {m['threads']} torch threads, torch {m['torch']}; "
        f"fp32 matmul peak measured in this run: **{m['peak_gflops']:.0f} GFLOP/s** (best `torch.mm` over square and FFN shapes).",
        "",
        "Target tokens/s of a full training step (forward, loss, backward, Adam step), fp32, vocabulary "
        f"{VOCAB}, uniform random tokens without padding; ratio = peer / ours; MFU = 3 x forward FLOPs "
        "(output layer at loss positions only) / step time / measured peak. Memory = peak RSS growth "
        "during the measured steps (weights, optimizer state, activations).",
        "",
        "| size | family | model | target tok/s | ratio to ours | MFU | step ms | memory MiB |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for block in res["throughput"]:
        for r in block["results"]:
            if "tok_s" not in r:
                lines.append(f"| {block['size']} | {block['family']} | {r['name']} | skipped | | | | |")
                continue
            lines.append(
                f"| {block['size']} ({block['batch'][0]}x{block['batch'][1]}) | {block['family']} | {r['name']} | "
                f"{r['tok_s']:,.0f} | {r['ratio_to_ours']:.2f} | {100 * r['mfu']:.0f}% | {1e3 * r['step_s']:.0f} | "
                f"{r['mem_mb']:.0f} |"
            )
    lines += ["", "## KV cache per generated token (Llama-style base, fp32, all layers)", "",
              "| attention | n_heads | n_kv_heads | bytes/token | ratio to MHA |", "|---|---:|---:|---:|---:|"]
    for r in res["kv_cache"]:
        lines.append(f"| {r['attention']} | {r['n_heads']} | {r['n_kv_heads']} | {r['bytes_per_token']:,} | "
                     f"{r['ratio_to_mha']:.3f} |")
    if res.get("scaling"):
        lines += ["", "## Scaling (ours, tiny encoder-decoder)", "",
                  "| sequence length | rows | tokens/s | step ms | MFU | memory MiB |", "|---:|---:|---:|---:|---:|---:|"]
        for r in res["scaling"]["seq_len"]:
            lines.append(f"| {r['seq_len']} | {r['rows']} | {r['tok_s']:,.0f} | {1e3 * r['step_s']:.0f} | "
                         f"{100 * r['mfu']:.0f}% | {r['mem_mb']:.0f} |")
        lines += ["", "| batch tokens (len 32) | rows | tokens/s | step ms | MFU | memory MiB |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for r in res["scaling"]["batch_tokens"]:
            lines.append(f"| {r['batch_tokens']} | {r['rows']} | {r['tok_s']:,.0f} | {1e3 * r['step_s']:.0f} | "
                         f"{100 * r['mfu']:.0f}% | {r['mem_mb']:.0f} |")
    if res.get("decode"):
        lines += ["", "## Decoding", "", "```", json.dumps(res["decode"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["tiny", "base"], choices=list(SIZES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="measured steps at tiny size (median reported)")
    p.add_argument("--base-steps", type=int, default=3, help="measured steps at base size")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--compile", action="store_true", help="add tiny rows with torch.compile on")
    p.add_argument("--no-ablation", action="store_true", help="leave out the 'ours, unfused loss' row")
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--scaling-lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--scaling-tokens", type=int, default=4096)
    p.add_argument("--scaling-rows", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--scaling-steps", type=int, default=2)
    p.add_argument("--decode", action="store_true", help="add benchmarks/decode_speed.py's row if present")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "train_throughput.json")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    start = time.time()
    peak = matmul_peak()
    print(f"fp32 matmul peak: {peak / 1e9:.0f} GFLOP/s ({args.threads} threads)", flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    res: dict[str, Any] = {
        "command": "python benchmarks/train_throughput.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": {"cpu": cpu_name(), "threads": args.threads, "torch": torch.__version__,
                    "peak_gflops": peak / 1e9},
    }
    res["throughput"] = throughput(args, peak)
    res["kv_cache"] = kv_cache()
    if not args.no_scaling:
        res["scaling"] = scaling(args, peak)
    if args.decode:
        res["decode"] = decode_row()
    peak_end = matmul_peak()
    res["machine"]["peak_gflops_end"] = peak_end / 1e9
    res["seconds"] = time.time() - start
    md = markdown(res)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    args.out.with_suffix(".md").write_text(md)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')} in {res['seconds']:.0f} s")


if __name__ == "__main__":
    main()
