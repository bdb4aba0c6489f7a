"""Decoding speed: our KV-cached greedy/beam search vs Hugging Face ``generate`` and CTranslate2
on the same weights.

    # one command: trains a tiny checkpoint first when RUN has none (scripts/train.py, ~10 min CPU)
    flock /tmp/cpu_heavy.lock python -m benchmarks.decode_speed --run runs/bench_tiny --data-root ../shared/data

Our trained encoder-decoder (post-LN, ReLU, sinusoidal, tied embeddings: the 2017 recipe) is copied
into a Hugging Face ``MarianMTModel`` of the same dimensions (:mod:`transformer.interop.hf_marian`,
the mapping ``scripts/export.py format=hf`` writes) and exported to a CTranslate2 folder
(:mod:`transformer.interop.ct2`, as ``scripts/export.py format=ctranslate2``); the benchmark first
checks that Marian gives the same logits. All systems then decode the same split (Multi30k
``test_2016_flickr``, 1000 sentences) with the same settings (:mod:`benchmarks.decoding`): beam
size, ``len ** alpha`` length penalty, a fixed maximum of ``--max-len`` tokens plus the (forced)
EOS, at least one token, PAD banned, at most ``--max-tokens`` source tokens x beam per batch. HF
runs with ``early_stopping="never"`` (``hf``), the exact stopping rule our beam search uses, and
with ``early_stopping=True`` (``hf_early``: stop at ``beam`` finished hypotheses, fairseq's
shortcut, fastest). CTranslate2 runs in fp32 (``ct2``) and with int8 weights quantized on load
(``ct2_int8``), ``--threads`` intra-op threads, one translator.

Each configuration runs in its own subprocess so that its peak memory (peak RSS on CPU,
``torch.cuda.max_memory_allocated`` on GPU) is its own. Printed: a side-by-side table with
sentences/s, generated tokens/s, ours' speed over each system's, peak memory, BLEU of each output
(sanity: the same model must score the same) and the share of sentences where the output equals
ours. Results also go to ``--out`` (JSON), the hypotheses to ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import REPO, decoding, module_command, reset_peak, worker_result

COMPUTE = {"ct2": "float32", "ct2_int8": "int8"}


def check_parity(model: Any, hf: Any) -> float:
    """Max |logit difference| between our model and the Marian copy on a padded batch."""
    import torch

    g = torch.Generator().manual_seed(0)
    src = torch.randint(5, 200, (3, 9), generator=g)
    src[:, -1] = 3
    src[1, 6:] = 0
    src[1, 5] = 3
    prev = torch.randint(5, 200, (3, 7), generator=g)
    prev[:, 0] = 2
    with torch.inference_mode():
        a = model(src, prev)
        b = hf(input_ids=src, attention_mask=src.ne(0), decoder_input_ids=prev).logits
    return float((a - b).abs().max())


def read_split(cfg: Any, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The sources and references of ``--split`` (its first ``--limit`` pairs)."""
    from transformer.data.corpus import read_parallel, resolve_split_files

    if args.data_root:
        cfg.data.root = args.data_root
    src, refs, _ = read_parallel(*resolve_split_files(cfg.data, args.split))
    n = args.limit or len(src)
    return src[:n], refs[:n]


def peak_mb(device: Any) -> float:
    """The peak memory of this process so far: ``torch.cuda.max_memory_allocated`` or the peak RSS."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Decode the split with one (system, strategy): the timings and the output token lists."""
    import torch

    from transformer.generation import load_run, resolve_device

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, toks, cfg = load_run(args.run, device)
    src_ids = toks.src.encode_batch(read_split(cfg, args)[0])
    gen = decoding.search(args.strategy, args.beam, args.max_len, args.lenpen, args.max_tokens)
    if args.system.startswith("hf"):
        run, _ = decoding.hf_generate(model, cfg.model, device, early_stopping="never" if args.system == "hf" else True)
    elif args.system in COMPUTE:
        tokenizers = (toks.src, toks.tgt)
        run, _ = decoding.ctranslate2(args.ct2_dir, tokenizers, device, COMPUTE[args.system], model.arch, args.threads)
    else:
        run = decoding.ours(model, device)
    model = None  # only the system under test holds weights now
    reset_peak(device)
    base_mb = peak_mb(device)
    row = decoding.timed(run, [src_ids], gen, device, warmup=src_ids[:16])
    return {
        "system": args.system,
        "strategy": args.strategy,
        "beam": gen.beam_size,
        "sentences": len(src_ids),
        **row,
        "peak_mb": peak_mb(device),
        "base_mb": base_mb,
        "device": str(device),
        "threads": args.threads,
        "compute_type": COMPUTE.get(args.system),
    }


def ensure_checkpoint(args: argparse.Namespace) -> None:
    """Train a tiny checkpoint into ``args.run`` with scripts/train.py when it has none."""
    run = Path(args.run)
    if (run / "checkpoint_best.safetensors").is_file() or (run / "checkpoint_last.safetensors").is_file():
        return
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        f"run_dir={run}",
        "model=transformer_tiny",
        f"train.max_time={args.train_seconds}",
        "train.validate_every=1000",
        "train.valid_bleu_subset=100",
        f"train.num_threads={args.threads}",
        "train.progress=false",
        "data.test_splits=[test_2016_flickr]",
    ]
    if args.data_root:
        cmd.append(f"data.root={args.data_root}")
    print(f"no checkpoint in {run}: training one ({args.train_seconds}s): {' '.join(cmd)}", file=sys.stderr)
    subprocess.run(cmd, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default="runs/bench_tiny", help="trained run folder (trained here when empty)")
    p.add_argument("--data-root", default=None, help="folder holding multi30k/ (default: the run's data.root)")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=0.6, help="alpha of len ** alpha (both systems)")
    p.add_argument("--max-len", type=int, default=60, help="tokens before the forced EOS (both systems)")
    p.add_argument("--max-tokens", type=int, default=8000, help="source tokens x beam per batch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--strategies", default="greedy,beam")
    p.add_argument(
        "--systems",
        default="ours,hf,hf_early,ct2,ct2_int8",
        help="ours, hf (early_stopping=never), hf_early, ct2 (CTranslate2 fp32), ct2_int8",
    )
    p.add_argument("--train-seconds", type=int, default=600)
    p.add_argument("--out", default=None, help="JSON results (default: <run>/decode_speed.json)")
    p.add_argument("--workdir", default=None, help="hypothesis files (default: <run>/decode_speed)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--system", default="ours", help=argparse.SUPPRESS)
    p.add_argument("--strategy", default="beam", help=argparse.SUPPRESS)
    p.add_argument("--ct2-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.workdir = args.workdir or str(Path(args.run) / "decode_speed")
    args.ct2_dir = args.ct2_dir or str(Path(args.workdir) / "ctranslate2")

    if args.worker:
        print(json.dumps(worker(args)))
        return

    ensure_checkpoint(args)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    import torch

    from transformer.evaluation import corpus_scores
    from transformer.generation import load_run

    torch.set_num_threads(args.threads)
    model, toks, cfg = load_run(args.run)
    systems = args.systems.split(",")
    if model.arch != "encoder_decoder" and any(s.startswith("hf") for s in systems):
        print(f"{args.run} is {model.arch}: the HF rows (Marian) are for encoder-decoders, skipped", file=sys.stderr)
        systems = [s for s in systems if not s.startswith("hf")]
    diff = None
    if any(s.startswith("hf") for s in systems):
        from transformer.interop.hf_marian import to_marian

        diff = check_parity(model, to_marian(model, cfg.model))
        print(f"parity: max |logits(ours) - logits(Marian copy)| = {diff:.2e}")
        if diff > 1e-3:
            raise SystemExit("the Marian copy does not reproduce our logits; the comparison would be meaningless")
    if any(s.startswith("ct2") for s in systems):
        from transformer.interop import export_run

        export_run(args.run, "ctranslate2", args.ct2_dir, force=True)
        print(f"exported {args.run} to {args.ct2_dir} (CTranslate2, fp32)")

    results = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    skip = ("worker", "system", "strategy", "strategies", "systems", "out")
    common = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in skip and v is not None]
    for strategy in args.strategies.split(","):
        for system in systems:
            if system == "hf_early" and strategy != "beam":
                continue
            cmd = module_command("decode_speed", "--worker", f"--system={system}", f"--strategy={strategy}", *common)
            r, why = worker_result(cmd, env=env)
            if r is None:
                raise SystemExit(f"worker {system}/{strategy} failed: {why}")
            print(f"  {system:9s} {strategy:6s} {r['sentences_per_s']:8.1f} sent/s  {r['peak_mb']:7.0f} MB", flush=True)
            results.append(r)

    refs = read_split(cfg, args)[1]
    ours = {r["strategy"]: r["outputs"] for r in results if r["system"] == "ours"}
    for r in results:
        outputs = r.pop("outputs")
        hyps = [toks.tgt.decode(t) for t in outputs]
        r["hyp_file"] = str(Path(args.workdir) / f"{r['system']}.{r['strategy']}.txt")
        Path(r["hyp_file"]).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        r["bleu"] = corpus_scores(hyps, refs)["bleu"]
        r["same_as_ours"] = decoding.same_share(outputs, ours[r["strategy"]]) if r["strategy"] in ours else None
    print(
        f"\nDecoding {args.split} ({results[0]['sentences']} sentences) on {results[0]['device']} with {args.threads} "
        f"threads; model {cfg.model.n_encoder_layers}+{cfg.model.n_decoder_layers} layers, d_model {cfg.model.d_model}, "
        f"vocab {len(toks.tgt)}; length penalty len^{args.lenpen}, max {args.max_len} tokens + EOS, "
        f"max_tokens {args.max_tokens}\n"
    )
    print("\n".join(decoding.markdown(results)))
    out = Path(args.out) if args.out else Path(args.run) / "decode_speed.json"
    out.write_text(json.dumps({"args": vars(args), "parity_max_abs_diff": diff, "results": results}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
