"""The Markdown of the GPU check's ``realistic`` section (the targets, the training table with each
of our rows' ratio to the peer's row of the same model, mode and batch, the trainer section's rows
beside them, and the decoding table) and of the ``trainer`` section."""

from __future__ import annotations

from typing import Any


def _f(x: Any, fmt: str) -> str:
    return "" if x is None else fmt.format(x)


def _why(x: dict[str, Any]) -> str:
    text = x.get("error") or x.get("skipped") or ""
    return ("**failed**: " if "error" in x else "skipped: ") + text.replace("|", "/")[:220]


def render_realistic(r: dict[str, Any]) -> list[str]:
    """The section's results as Markdown lines."""
    out = [
        f"bf16 autocast, vocabulary {r.get('vocab')}, lengths from {r.get('lengths_from')}; "
        f"{r.get('warmup')} warm-up + {r.get('steps')} measured steps (median); MFU against "
        f"{_f(r.get('peak_bf16_tflops'), '{:.4g}')} TFLOP/s ({r.get('peak_source')}), real tokens only.",
        "",
    ]
    if r.get("targets"):
        out += ["| target | bound | value | status | detail |", "|---|---:|---:|---|---|"]
        for t in r["targets"]:
            pct = t["unit"] == "MFU"
            bound = f">= {100 * t['bound']:.0f}%" if pct else f">= {t['bound']:g}x"
            value = "" if t["value"] is None else f"{100 * t['value']:.1f}%" if pct else f"{t['value']:.2f}x"
            out.append(f"| {t['what']} | {bound} | {value} | **{t['status']}** | {t['detail'].replace('|', '/')} |")
        out.append("")
    rows = r.get("rows", [])
    peer = {(x["model"], x["mode"], x["max_tokens"]): x for x in rows if x["system"] != "ours" and "tok_s" in x}
    out += [
        "| model | system | mode | max tokens | rows x src x tgt | target tokens | padding | target tok/s | "
        "ours / peer | MFU | step ms | first step s | peak MiB | params | graphs / breaks |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for x in rows:
        head = f"| {x['model']} | {x['system']} | {x['mode']} | {x['max_tokens']} |"
        if "tok_s" not in x:
            out.append(f"{head} {_why(x)} | | | | | | | | | | |")
            continue
        b = x["batch"]
        shape = b["shape"].get("src") or b["shape"]["tokens"]
        dims = (
            f"{b['rows']} x {shape[1]} x {b['shape']['target'][1]}"
            if "src" in b["shape"]
            else f"{b['rows']} x {shape[1]} (one sequence)"
        )
        other = peer.get((x["model"], x["mode"], x["max_tokens"])) if x["system"] == "ours" else None
        graphs = f"{x['graphs']} / {x['graph_breaks']}" if "graphs" in x else ""
        out.append(
            f"{head} {dims} | {b['target_tokens']:,} | {100 * b['padding']:.0f}% | {x['tok_s']:,.0f} | "
            f"{_f(other and x['tok_s'] / other['tok_s'], '{:.2f}x')} | {100 * x['mfu']:.1f}% | "
            f"{1e3 * x['step_s']:.1f} | {x['first_step_s']:.1f} | {_f(x.get('mem_mb'), '{:,.0f}')} | "
            f"{x['params'] / 1e6:.3g}M | {graphs} |"
        )
    out += [_trainer_line(x) for x in r.get("trainer_rows", [])]
    setup = r.get("decoding_setup")
    if setup or r.get("decoding"):
        out += [""]
        if setup:
            out += [
                f"Decoding: {setup['model']}, {setup['sentences']} sentences of {setup['split']} in batches of "
                f"{setup['batch']}, every output at most {setup['max_len']} tokens + EOS, {setup['precision']}.",
                "",
            ]
        out += [
            "| system | search | seconds | sentences/s | tokens/s | ours / system | mean output length | "
            "equal to ours | peak MiB |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        ours = {x["strategy"]: x for x in r.get("decoding", []) if x["system"] == "ours" and "seconds" in x}
        for x in r.get("decoding", []):
            head = f"| {x['system']} | {x['strategy']} |"
            if "seconds" not in x:
                out.append(f"{head} {_why(x)} | | | | | | |")
                continue
            mine = ours.get(x["strategy"])
            ratio = mine["sentences_per_s"] / x["sentences_per_s"] if mine and x["system"] != "ours" else None
            out.append(
                f"{head} {x['seconds']:.2f} | {x['sentences_per_s']:,.1f} | {x['tokens_per_s']:,.0f} | "
                f"{_f(ratio, '{:.2f}x')} | {x['mean_output_len']:.1f} | "
                f"{_f(x.get('equal_to_ours'), '{:.0%}')} | {_f(x.get('peak_mb'), '{:,.0f}')} |"
            )
    return out


def _graphs(x: dict[str, Any]) -> str:
    g = x.get("graphs") or {}
    return f"{g.get('graphs_first')} / {g.get('graphs_warmup')} / {g.get('graphs_timed')}" if x.get("compile") else ""


def _trainer_line(x: dict[str, Any]) -> str:
    """A trainer section's row in the realistic section's training table (its 15 columns)."""
    return (
        f"| {x['model']} | Trainer.train_step | {x['mode']} | {x['max_tokens']} | WMT-like, "
        f"{x['rows_per_update']:.0f} rows, mean target {x['mean_tgt_len']:.1f} | "
        f"{x['target_tokens_per_update']:,.0f} (mean) | {100 * x['padding']:.0f}% | {x['tok_s']:,.0f} | | "
        f"{100 * x['mfu']:.1f}% | {x['ms_per_update']:.1f} | {x['first_update_s']:.1f} | "
        f"{_f(x.get('mem_mb'), '{:,.0f}')} | {x['params'] / 1e6:.3g}M | {_graphs(x)} |"
    )


def render_trainer(r: dict[str, Any]) -> list[str]:
    """The ``trainer`` section's results as Markdown lines."""
    c = r.get("corpus") or {}
    out = [
        f"`{r.get('model')}` through `Trainer.train_step` (its data path, `train.precision=auto`), "
        f"`train.max_tokens={r.get('max_tokens')}`, vocabulary {r.get('vocab')} (ids of the "
        f"{r.get('tokenizer_vocab')}-piece tokenizer); corpus: {r.get('corpus_from')}: {c.get('pairs')} pairs, "
        f"target mean {c.get('mean_tgt_len')} pieces, 99th percentile {c.get('tgt_len_p99')}, longest "
        f"{c.get('max_tgt_len')}, {_f(c.get('share_tgt_ge_128'), '{:.2%}')} of 128 or more. MFU against "
        f"{_f(r.get('peak_bf16_tflops'), '{:.4g}')} TFLOP/s ({r.get('peak_source')}), real tokens only.",
        "",
    ]
    t = r.get("target")
    if t:
        value = "" if t["value"] is None else f"{100 * t['value']:.1f}%"
        out += [
            f"Target: {t['what']} >= {100 * t['bound']:.0f}%: {value} **{t['status']}** {t['detail']}".rstrip(),
            "",
        ]
    out += [
        "| mode | precision | compile | distributed | target tok/s | ms / update | MFU | first update s | compile s | "
        "target tokens / update | rows / update | padding | peak MiB | graphs (first / warm-up / timed) | last loss |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for x in r.get("rows", []):
        if "tok_s" not in x:
            out.append(f"| {x['mode']} | {_why(x)} | | | | | | | | | | | | | |")
            continue
        backend = f" ({x['backend']})" if x.get("backend") else ""
        out.append(
            f"| {x['mode']} | {x['precision']} | {x['compile']}{backend} | {x['distributed']} | {x['tok_s']:,.0f} | "
            f"{x['ms_per_update']:.1f} | {100 * x['mfu']:.1f}% | {x['first_update_s']:.2f} | "
            f"{_f(x.get('compile_s'), '{:.1f}')} | {x['target_tokens_per_update']:,.0f} | {x['rows_per_update']:.0f} | "
            f"{100 * x['padding']:.0f}% | {_f(x.get('mem_mb'), '{:,.0f}')} | {_graphs(x)} | {x['last_loss']:.3f} |"
        )
    return out
