"""The Markdown report of ``benchmarks/train_throughput.py`` (``train_throughput.md``): the
throughput table, the KV cache, the scaling points and the folded-in decoding rows."""

from __future__ import annotations

from typing import Any

from train_step import VOCAB


def _skip_cell(r: dict[str, Any]) -> str:
    reason = r["skipped"].replace("|", "/")
    return f"skipped ({reason[:100]})"


def markdown(res: dict[str, Any]) -> str:
    """The report of one run of the benchmark (``res``: what ``train_throughput.main`` collected)."""
    m = res["machine"]
    malloc = (
        "tuned for every model (`transformer.training.job.allocator.tune_cpu_allocator`: glibc `mallopt` "
        "mmap and trim thresholds raised)"
        if m["malloc"] == "tuned"
        else "default for every model"
    )
    rows = [r for block in res["throughput"] for r in block["results"]]
    rows += [r for part in (res.get("scaling") or {}).values() for r in part]
    untuned = [r["name"] for r in rows if m["malloc"] == "tuned" and "malloc_tuned" in r and not r["malloc_tuned"]]
    if untuned:
        malloc += f" (mallopt unavailable in the workers of: {', '.join(untuned)})"
    lines = [
        "# Train-step throughput against peers",
        "",
        f"Command: `{res['command']}`  ",
        f"Date: {res['date']}; commit `{res['commit']}`  ",
        f"Machine: {m['cpu']}, {m['threads']} torch threads, torch {m['torch']}"
        + (
            f"; **GPU: {m['gpu']}** (every row on the GPU; peaks: datasheet, else a matmul probe)"
            if m.get("gpu")
            else ""
        )
        + "; "
        "Matmul peak measured in this run (best `torch.mm` over square and FFN shapes), at the start / at the end: "
        + "; ".join(
            f"{prec} **{m['peaks_gflops'][prec]:.1f}** / {m.get('peaks_gflops_end', {}).get(prec, float('nan')):.1f} GFLOP/s"
            for prec in m["peaks_gflops"]
        )
        + "; MFU uses the higher of the row's dtype. "
        f"Step times: median over {res.get('rounds', 1)} (tiny) / {res.get('base_rounds', 1)} (base) interleaved rounds per model "
        "of the median step of each round.  ",
        f"glibc malloc: {malloc}.",
        "",
        "Target tokens/s of a full training step (forward, loss, backward, Adam step) at the row's precision "
        '(bf16 = `torch.autocast("cpu", bfloat16)` around forward and loss for every model), vocabulary '
        f"{VOCAB}, uniform random tokens without padding; each model in a fresh process; ratio = peer / ours at the "
        "same precision; bf16/fp32 = ours in bf16 over ours in fp32; "
        "MFU = 3 x forward FLOPs (output layer at loss positions only) / step time / measured peak. "
        "Memory = peak RSS of a fresh process per model minus its RSS before the model was built (weights, "
        "grads, optimizer state, activations, allocator caching).",
        "",
        "Dropout: HF Llama and x-transformers (decoder-only) run without dropout, so the decoder-only `ours` row "
        "(the one the ratios are against) runs the preset with `model.dropout=0.0`; the `ours, preset dropout` "
        "row is the preset as shipped. Encoder-decoder rows all use the preset's dropout: ours, Marian and BART "
        "on embeddings and residual branches; nn.Transformer also on attention weights and FFN hidden units; "
        "x-transformers on embeddings and FFN hidden units only.",
        "",
        "| size | family | model | precision | dropout | target tok/s | ratio to ours | bf16/fp32 | MFU | step ms | memory MiB |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    compiled = []
    bf16_skips = {
        r["skipped"]
        for block in res["throughput"]
        for r in block["results"]
        if r.get("precision") == "bf16" and r.get("skipped", "").startswith("no fast bf16")
    }
    for block in res["throughput"]:
        size = f"{block['size']} ({block['batch'][0]}x{block['batch'][1]})"
        for r in block["results"]:
            prec = r.get("precision", "fp32")
            if r.get("skipped") in bf16_skips:
                continue  # one sentence under the table
            if "tok_s" not in r:
                lines.append(f"| {size} | {block['family']} | {r['name']} | {prec} | | {_skip_cell(r)} | | | | | |")
                continue
            ratio = f"{r['ratio_to_ours']:.2f}" if "ratio_to_ours" in r else ""
            speedup = f"{r['speedup_vs_ours_fp32']:.2f}" if "speedup_vs_ours_fp32" in r else ""
            lines.append(
                f"| {size} | {block['family']} | {r['name']} | {prec} | {r['dropout']} | "
                f"{r['tok_s']:,.0f} | {ratio} | {speedup} | {100 * r['mfu']:.0f}% | {1e3 * r['step_s']:.0f} | "
                f"{r['mem_mb']:.0f} |"
            )
            if "compile_s" in r:
                compiled.append(f"{block['size']} {block['family']} {r['compile_s']:.1f} s")
    if compiled:
        lines += ["", "torch.compile rows: first (compiling) step, not in the step time: " + "; ".join(compiled) + "."]
    for reason in sorted(bf16_skips):
        lines += ["", f"bf16 rows not run: {reason}."]
    lines += [
        "",
        "## KV cache per generated token (Llama-style base, fp32, all layers)",
        "",
        "| attention | n_heads | n_kv_heads | bytes/token | ratio to MHA |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in res["kv_cache"]:
        lines.append(
            f"| {r['attention']} | {r['n_heads']} | {r['n_kv_heads']} | {r['bytes_per_token']:,} | "
            f"{r['ratio_to_mha']:.3f} |"
        )
    if res.get("scaling"):
        for key, head in (("seq_len", "sequence length"), ("batch_tokens", "batch tokens (len 32)")):
            if key == "seq_len":
                lines += ["", "## Scaling (ours, tiny encoder-decoder, one process per point)"]
            lines += [
                "",
                f"| {head} | rows | tokens/s | step ms | MFU | memory MiB |",
                "|---:|---:|---:|---:|---:|---:|",
            ]
            for r in res["scaling"][key]:
                if "tok_s" not in r:
                    lines.append(f"| {r[key]} | {r['rows']} | {_skip_cell(r)} | | | |")
                    continue
                lines.append(
                    f"| {r[key]} | {r['rows']} | {r['tok_s']:,.0f} | {1e3 * r['step_s']:.0f} | "
                    f"{100 * r['mfu']:.0f}% | {r['mem_mb']:.0f} |"
                )
    if res.get("decode"):
        d = res["decode"]
        lines += [
            "",
            f"## Decoding ({d['split']}, {d['device']}, {d['threads']} threads; from `{d['file']}`)",
            "",
            "Same checkpoint in both systems (ours copied into a same-size HF Marian); ratio = system / ours.",
            "",
            "| system | search | sentences/s | target tok/s | ratio to ours | peak MiB | BLEU | same output as ours |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in d["rows"]:
            ratio = "" if r["ratio_to_ours"] is None else f"{r['ratio_to_ours']:.2f}"
            same = "" if r["same_as_ours"] is None else f"{100 * r['same_as_ours']:.1f}%"
            search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            lines.append(
                f"| {r['system']} | {search} | {r['sentences_per_s']:.1f} | {r['tokens_per_s']:,.0f} | {ratio} | "
                f"{r['peak_mb']:.0f} | {r['bleu']:.2f} | {same} |"
            )
    return "\n".join(lines) + "\n"
