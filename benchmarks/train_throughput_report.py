"""The Markdown report of ``benchmarks/train_throughput.py`` (``train_throughput.md``): the
throughput table, the scaling points and the table of a decoding results file."""

from __future__ import annotations

from typing import Any

from benchmarks import decoding
from benchmarks.train_step import VOCAB
from transformer.analysis.markdown import cell, table


def _skip_cell(r: dict[str, Any]) -> str:
    return f"skipped ({cell(r['skipped'], limit=100)})"


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
        "Target tokens/s of a full training step at the row's precision (ours: the trainer's own update, "
        "`Trainer.train_step`, with its token-normalised loss, clipping and schedule; a peer: forward, loss, "
        "backward, Adam step) "
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
    ]
    header = [
        "size",
        "family",
        "model",
        "precision",
        "dropout",
        "target tok/s",
        "ratio to ours",
        "bf16/fp32",
        "MFU",
        "step ms",
        "memory MiB",
    ]
    cells = []
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
                cells.append([size, block["family"], r["name"], prec, "", _skip_cell(r)])
                continue
            cells.append(
                [
                    size,
                    block["family"],
                    r["name"],
                    prec,
                    cell(r["dropout"]),
                    cell(r["tok_s"], "{:,.0f}"),
                    cell(r.get("ratio_to_ours"), "{:.2f}"),
                    cell(r.get("speedup_vs_ours_fp32"), "{:.2f}"),
                    cell(100 * r["mfu"], "{:.0f}%"),
                    cell(1e3 * r["step_s"], "{:.0f}"),
                    cell(r["mem_mb"], "{:.0f}"),
                ]
            )
            if "compile_s" in r:
                compiled.append(f"{block['size']} {block['family']} {r['compile_s']:.1f} s")
    lines += table(header, "lllllrrrrrr", cells)
    if compiled:
        lines += ["", "torch.compile rows: first (compiling) step, not in the step time: " + "; ".join(compiled) + "."]
    for reason in sorted(bf16_skips):
        lines += ["", f"bf16 rows not run: {reason}."]
    if res.get("scaling"):
        for key, head in (("seq_len", "sequence length"), ("batch_tokens", "batch tokens (len 32)")):
            if key == "seq_len":
                lines += ["", "## Scaling (ours, tiny encoder-decoder, one process per point)"]
            points = [
                [cell(r[key]), cell(r["rows"]), _skip_cell(r)]
                if "tok_s" not in r
                else [
                    cell(r[key]),
                    cell(r["rows"]),
                    cell(r["tok_s"], "{:,.0f}"),
                    cell(1e3 * r["step_s"], "{:.0f}"),
                    cell(100 * r["mfu"], "{:.0f}%"),
                    cell(r["mem_mb"], "{:.0f}"),
                ]
                for r in res["scaling"][key]
            ]
            lines += ["", *table([head, "rows", "tokens/s", "step ms", "MFU", "memory MiB"], "rrrrrr", points)]
    if res.get("decode"):
        d = res["decode"]
        a = d["args"]
        lines += ["", f"## Decoding ({a['split']}, {a['device']}, {a['threads']} threads; from `{d['file']}`)", ""]
        lines += decoding.markdown(d["results"])
    return "\n".join(lines) + "\n"
