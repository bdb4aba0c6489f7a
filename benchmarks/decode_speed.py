"""Decoding speed: our KV-cached greedy/beam search vs Hugging Face ``generate`` and CTranslate2
on the same weights.

    # one command: trains a tiny checkpoint first when RUN has none (scripts/train.py, ~10 min CPU)
    flock /tmp/cpu_heavy.lock python -m benchmarks.decode_speed --run runs/bench_tiny --data-root ../shared/data

Our trained encoder-decoder (post-LN, ReLU, sinusoidal, tied embeddings: the 2017 recipe) is copied
into a Hugging Face ``MarianMTModel`` of the same dimensions (:mod:`transformer.interop.hf_marian`,
the mapping ``scripts/export.py format=hf`` writes) and exported to a CTranslate2 folder
(:mod:`transformer.interop.ct2`, as ``scripts/export.py format=ctranslate2``); the benchmark first
checks that Marian gives the same logits. All systems then decode the same split (Multi30k
``test_2016_flickr``, 1000 sentences) with the same settings: beam size, ``len ** alpha`` length
penalty (the only form HF and CTranslate2 have), a fixed maximum of ``--max-len`` tokens plus the
(forced) EOS, at least one token, PAD banned. Ours and HF get the same batches (sorted by length,
at most ``--max-tokens`` source tokens x beam per batch); CTranslate2 gets every sentence at once
and batches by ``--max-tokens / beam`` source tokens itself (``batch_type="tokens"``). HF runs with
``early_stopping="never"``, the exact stopping rule our beam search uses (no running beam can beat
the kept ones, bounded with the maximum length), and optionally with ``early_stopping=True`` (stop
at ``beam`` finished hypotheses, fairseq's shortcut, fastest). CTranslate2 runs in fp32
(``ct2``) and with int8 weights quantized on load (``ct2_int8``), ``--threads`` intra-op threads,
one translator; its outputs cut at the maximum get the EOS ours forces, for the comparison.

Each configuration runs in its own subprocess so that its peak memory (peak RSS on CPU,
``torch.cuda.max_memory_allocated`` on GPU) is its own. Printed: a side-by-side table with
sentences/s, generated tokens/s, peak memory, BLEU of each output (sanity: the same model must score
the same) and the share of sentences where the output equals ours, plus the speed ratios.
Results also go to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO, module_command, synchronize

# ----------------------------------------------------------------------------- parity


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


# ----------------------------------------------------------------------------- worker


def _peak_mb(device: Any) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Decode the split with one (system, strategy); returns timings and writes the hypotheses."""
    import torch

    from transformer.config import GenerationConfig
    from transformer.data.corpus import read_parallel, resolve_split_files
    from transformer.generation import load_run, resolve_device, translate_sentences
    from transformer.generation.translate import batches_by_tokens, make_src_tokens
    from transformer.interop.ct2 import ct2_translate, load_ct2
    from transformer.interop.hf_marian import marian_generate, to_marian

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, toks, cfg = load_run(args.run, device)
    if args.data_root:
        cfg.data.root = args.data_root
    src_lines, refs, _ = read_parallel(*resolve_split_files(cfg.data, args.split))
    if args.limit:
        src_lines, refs = src_lines[: args.limit], refs[: args.limit]
    src_ids = toks.src.encode_batch(src_lines)
    beam = args.beam if args.strategy == "beam" else 1
    gen = GenerationConfig(
        strategy=args.strategy,
        beam_size=beam,
        length_penalty=args.lenpen,
        length_penalty_form="fairseq",
        max_len_a=0.0,
        max_len_b=args.max_len,
        min_len=1,
        nbest=1,
        max_tokens=args.max_tokens,
    )
    arch, eos = model.arch, model.eos_id
    hf = engine = None
    if args.system.startswith("hf"):
        hf = to_marian(model.cpu(), cfg.model).to(device)
        model = None
    elif args.system.startswith("ct2"):
        compute = {"ct2": "float32", "ct2_int8": "int8"}[args.system]
        engine = load_ct2(args.ct2_dir, arch, device=device.type, compute_type=compute, threads=args.threads)
        model = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    base_mb = _peak_mb(device)

    def run_hf(ids: list[list[int]]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in ids]  # an empty source stays empty, as ours
        todo = [i for i, s in enumerate(ids) if s]
        early = {"hf": "never", "hf_early": True}[args.system]
        for batch in batches_by_tokens([len(ids[i]) + 1 for i in todo], args.max_tokens, beam):
            idx = [todo[j] for j in batch]
            src = make_src_tokens([ids[i] for i in idx], "encoder_decoder", device=device)
            for i, row in zip(idx, marian_generate(hf, src, gen, early_stopping=early)):
                out[i] = row
        return out

    def run_ct2(ids: list[list[int]]) -> list[list[int]]:
        rows = ct2_translate(
            engine, ids, gen, toks.src, toks.tgt, arch, max_batch_tokens=max(1, args.max_tokens // beam)
        )
        return [r if not r or r[-1] == eos else r + [eos] for r in rows]  # the EOS ours forces at the maximum

    def run_ours(ids: list[list[int]]) -> list[list[int]]:
        return [h[0].tokens if h else [] for h in translate_sentences(model, ids, gen, device, arch)]

    decode = {"ours": run_ours, "hf": run_hf, "hf_early": run_hf, "ct2": run_ct2, "ct2_int8": run_ct2}[args.system]
    decode(src_ids[:16])  # warm-up
    synchronize(device)
    start = time.perf_counter()
    outputs = decode(src_ids)
    synchronize(device)
    seconds = time.perf_counter() - start
    hyps = [toks.tgt.decode(t) for t in outputs]
    out_file = Path(args.workdir) / f"{args.system}.{args.strategy}.txt"
    out_file.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (out_file.with_suffix(".ids.json")).write_text(json.dumps(outputs))
    return {
        "system": args.system,
        "strategy": args.strategy,
        "beam": beam,
        "sentences": len(src_ids),
        "seconds": seconds,
        "sentences_per_s": len(src_ids) / seconds,
        "tokens_per_s": sum(len(t) for t in outputs) / seconds,
        "peak_mb": _peak_mb(device),
        "base_mb": base_mb,
        "hyp_file": str(out_file),
        "device": str(device),
        "threads": args.threads,
        "compute_type": {"ct2": "float32", "ct2_int8": "int8"}.get(args.system),
    }


# ----------------------------------------------------------------------------- driver


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
        print("RESULT " + json.dumps(worker(args)))
        return

    ensure_checkpoint(args)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    import torch

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
    for strategy in args.strategies.split(","):
        for system in systems:
            if system == "hf_early" and strategy != "beam":
                continue
            cmd = module_command("decode_speed", "--worker", f"--system={system}", f"--strategy={strategy}") + [
                f"--{k.replace('_', '-')}={v}"
                for k, v in vars(args).items()
                if k not in ("worker", "system", "strategy", "strategies", "systems", "out") and v is not None
            ]
            res = subprocess.run(
                cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )
            line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
            if res.returncode != 0 or not line:
                print(res.stdout[-2000:], res.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"worker {system}/{strategy} failed")
            r = json.loads(line[0][len("RESULT ") :])
            print(f"  {system:9s} {strategy:6s} {r['sentences_per_s']:8.1f} sent/s  {r['peak_mb']:7.0f} MB", flush=True)
            results.append(r)

    from transformer.data.corpus import read_parallel, resolve_split_files
    from transformer.evaluation import corpus_scores

    if args.data_root:
        cfg.data.root = args.data_root
    _, refs, _ = read_parallel(*resolve_split_files(cfg.data, args.split))
    refs = refs[: args.limit] if args.limit else refs
    ours_ids = {
        r["strategy"]: json.loads(Path(r["hyp_file"]).with_suffix(".ids.json").read_text())
        for r in results
        if r["system"] == "ours"
    }
    for r in results:
        hyps = Path(r["hyp_file"]).read_text(encoding="utf-8").splitlines()
        r["bleu"] = corpus_scores(hyps, refs)["bleu"]
        ids = json.loads(Path(r["hyp_file"]).with_suffix(".ids.json").read_text())
        mine = ours_ids.get(r["strategy"])
        r["same_as_ours"] = None if mine is None else sum(a == b for a, b in zip(ids, mine)) / len(ids)

    dev = results[0]["device"]
    print(
        f"\nDecoding {args.split} ({results[0]['sentences']} sentences) on {dev} with {args.threads} threads; "
        f"model {cfg.model.n_encoder_layers}+{cfg.model.n_decoder_layers} layers, d_model {cfg.model.d_model}, "
        f"vocab {len(toks.tgt)}; length penalty len^{args.lenpen}, max {args.max_len} tokens + EOS, "
        f"max_tokens {args.max_tokens}\n"
    )
    head = f"| {'system':<28} | {'search':<7} | {'sent/s':>7} | {'tok/s':>7} | {'peak MB':>8} | {'BLEU':>6} | {'= ours':>6} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    names = {
        "ours": "ours (KV cache)",
        "hf": "HF generate (never)",
        "hf_early": "HF generate (early_stop)",
        "ct2": "CTranslate2 fp32",
        "ct2_int8": "CTranslate2 int8",
    }
    for r in results:
        same = "" if r["same_as_ours"] is None else f"{100 * r['same_as_ours']:.1f}%"
        search = "greedy" if r["strategy"] == "greedy" else f"beam {r['beam']}"
        print(
            f"| {names[r['system']]:<28} | {search:<7} | {r['sentences_per_s']:7.1f} | {r['tokens_per_s']:7.0f} "
            f"| {r['peak_mb']:8.0f} | {r['bleu']:6.2f} | {same:>6} |"
        )
    print()
    by = {(r["system"], r["strategy"]): r for r in results}
    for strategy in args.strategies.split(","):
        ours = by.get(("ours", strategy))
        for system in ("hf", "hf_early", "ct2", "ct2_int8"):
            other = by.get((system, strategy))
            if ours and other:
                print(
                    f"speed-up ours / {names[system]} ({strategy}): "
                    f"{ours['sentences_per_s'] / other['sentences_per_s']:.2f}x"
                )
    ours_beam, ct2_beam = by.get(("ours", "beam")), by.get(("ct2", "beam"))
    if ours_beam and ct2_beam:
        ratio = ours_beam["sentences_per_s"] / ct2_beam["sentences_per_s"]
        print(
            f"goal: ours >= 0.5x CTranslate2 fp32 at beam {args.beam}: {ratio:.2f}x, "
            f"{'met' if ratio >= 0.5 else 'missed'}"
        )
    if ("ours", "greedy") in by and ("ours", "beam") in by:
        print(
            f"ours: greedy / beam {args.beam}: "
            f"{by[('ours', 'greedy')]['sentences_per_s'] / by[('ours', 'beam')]['sentences_per_s']:.2f}x"
        )
    out = Path(args.out) if args.out else Path(args.run) / "decode_speed.json"
    out.write_text(json.dumps({"args": vars(args), "parity_max_abs_diff": diff, "results": results}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
