"""The Markdown of the GPU check's ``realistic`` section (the targets, the training table with each
of our rows' ratio to the peer's row of the same model, mode and batch, the trainer section's rows
beside them, and the decoding table) and of the ``trainer`` section; :func:`columns`, the way every
table of the check is written with :mod:`transformer.analysis.markdown`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from transformer.analysis.markdown import cell, table

Column = tuple[str, str, str]  # title, the record's key, the cell's format (transformer.analysis.markdown.cell)


def columns(cols: Sequence[Column], align: str, records: Iterable[dict[str, Any] | list[str]]) -> list[str]:
    """The lines of a table of ``cols``: a record (dict) gives each column ``cell(record.get(key), spec)``;
    a list is a row of cells as they are (a short one says why a row has no measurement)."""
    rows = [r if isinstance(r, list) else [cell(r.get(key), spec) for _, key, spec in cols] for r in records]
    return table([title for title, _, _ in cols], align, rows)


def _why(x: dict[str, Any]) -> str:
    """The cell of a row that has no measurement: its error or why it was skipped."""
    text = x.get("error") or x.get("skipped") or ""
    return ("**failed**: " if "error" in x else "skipped: ") + cell(text, limit=220)


TARGETS: list[Column] = [
    ("target", "what", "{}"),
    ("bound", "bound", "{}"),
    ("value", "value", "{}"),
    ("status", "status", "**{}**"),
    ("detail", "detail", "{}"),
]
TRAINING: list[Column] = [  # the realistic section's training table; the trainer section's rows join it
    ("model", "model", "{}"),
    ("system", "system", "{}"),
    ("mode", "mode", "{}"),
    ("max tokens", "max_tokens", "{}"),
    ("rows x src x tgt", "dims", "{}"),
    ("target tokens", "target_tokens", "{:,}"),
    ("padding", "padding", "{:.0%}"),
    ("target tok/s", "tok_s", "{:,.0f}"),
    ("ours / peer", "ratio", "{:.2f}x"),
    ("MFU", "mfu", "{:.1%}"),
    ("step ms", "step_ms", "{:.1f}"),
    ("first step s", "first_step_s", "{:.1f}"),
    ("peak MiB", "mem_mb", "{:,.0f}"),
    ("params", "params_m", "{:.3g}M"),
    ("graphs / breaks", "graphs", "{}"),
]
DECODING: list[Column] = [
    ("system", "system", "{}"),
    ("search", "strategy", "{}"),
    ("seconds", "seconds", "{:.2f}"),
    ("sentences/s", "sentences_per_s", "{:,.1f}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("ours / system", "ratio", "{:.2f}x"),
    ("mean output length", "mean_output_len", "{:.1f}"),
    ("equal to ours", "equal_to_ours", "{:.0%}"),
    ("peak MiB", "peak_mb", "{:,.0f}"),
]
TRAINER: list[Column] = [
    ("mode", "mode", "{}"),
    ("precision", "precision", "{}"),
    ("compile", "compile", "{}"),
    ("distributed", "distributed", "{}"),
    ("target tok/s", "tok_s", "{:,.0f}"),
    ("ms / update", "ms_per_update", "{:.1f}"),
    ("MFU", "mfu", "{:.1%}"),
    ("first update s", "first_update_s", "{:.2f}"),
    ("compile s", "compile_s", "{:.1f}"),
    ("target tokens / update", "target_tokens_per_update", "{:,.0f}"),
    ("rows / update", "rows_per_update", "{:.0f}"),
    ("padding", "padding", "{:.0%}"),
    ("peak MiB", "mem_mb", "{:,.0f}"),
    ("graphs (first / warm-up / timed)", "graphs", "{}"),
    ("last loss", "last_loss", "{:.3f}"),
]


def render_realistic(r: dict[str, Any]) -> list[str]:
    """The section's results as Markdown lines."""
    out = [
        f"bf16 autocast, vocabulary {r.get('vocab')}, lengths from {r.get('lengths_from')}; "
        f"{r.get('warmup')} warm-up + {r.get('steps')} measured steps (median); MFU against "
        f"{cell(r.get('peak_bf16_tflops'), '{:.4g}')} TFLOP/s ({r.get('peak_source')}), real tokens only.",
        "",
    ]
    if r.get("targets"):
        targets = []
        for t in r["targets"]:
            pct = t["unit"] == "MFU"
            bound = f">= {100 * t['bound']:.0f}%" if pct else f">= {t['bound']:g}x"
            targets.append({**t, "bound": bound, "value": cell(t["value"], "{:.1%}" if pct else "{:.2f}x")})
        out += [*columns(TARGETS, "lrrll", targets), ""]
    rows = r.get("rows", [])
    peer = {(x["model"], x["mode"], x["max_tokens"]): x for x in rows if x["system"] != "ours" and "tok_s" in x}
    records: list[dict[str, Any] | list[str]] = []
    for x in rows:
        if "tok_s" not in x:
            records.append([cell(x[k]) for k in ("model", "system", "mode", "max_tokens")] + [_why(x)])
            continue
        b = x["batch"]
        shape = b["shape"].get("src") or b["shape"]["tokens"]
        other = peer.get((x["model"], x["mode"], x["max_tokens"])) if x["system"] == "ours" else None
        records.append(
            {
                **x,
                "dims": f"{b['rows']} x {shape[1]} x {b['shape']['target'][1]}"
                if "src" in b["shape"]
                else f"{b['rows']} x {shape[1]} (one sequence)",
                "target_tokens": b["target_tokens"],
                "padding": b["padding"],
                "ratio": other and x["tok_s"] / other["tok_s"],
                "step_ms": 1e3 * x["step_s"],
                "params_m": x["params"] / 1e6,
                "graphs": f"{x['graphs']} / {x['graph_breaks']}" if "graphs" in x else None,
            }
        )
    records += [_trainer_cells(x) for x in r.get("trainer_rows", [])]
    out += columns(TRAINING, "lllrlrrrrrrrrrl", records)
    setup = r.get("decoding_setup")
    if setup or r.get("decoding"):
        out += [""]
        if setup:
            out += [
                f"Decoding: {setup['model']}, {setup['sentences']} sentences of {setup['split']} in batches of "
                f"{setup['batch']}, every output at most {setup['max_len']} tokens + EOS, {setup['precision']}.",
                "",
            ]
        ours = {x["strategy"]: x for x in r.get("decoding", []) if x["system"] == "ours" and "seconds" in x}
        decoding: list[dict[str, Any] | list[str]] = []
        for x in r.get("decoding", []):
            if "seconds" not in x:
                decoding.append([cell(x["system"]), cell(x["strategy"]), _why(x)])
                continue
            mine = ours.get(x["strategy"])
            ratio = mine["sentences_per_s"] / x["sentences_per_s"] if mine and x["system"] != "ours" else None
            decoding.append({**x, "ratio": ratio})
        out += columns(DECODING, "llrrrrrrr", decoding)
    return out


def _graphs(x: dict[str, Any]) -> str:
    g = x.get("graphs") or {}
    return f"{g.get('graphs_first')} / {g.get('graphs_warmup')} / {g.get('graphs_timed')}" if x.get("compile") else ""


def _trainer_cells(x: dict[str, Any]) -> list[str]:
    """A trainer section's row in the realistic section's training table (:data:`TRAINING`)."""
    wmt = f"WMT-like, {x['rows_per_update']:.0f} rows, mean target {x['mean_tgt_len']:.1f}"
    row = {**x, "system": "Trainer.train_step", "dims": wmt, "step_ms": x["ms_per_update"], "graphs": _graphs(x)}
    row.update(first_step_s=x["first_update_s"], params_m=x["params"] / 1e6)
    cells = [cell(row.get(key), spec) for _, key, spec in TRAINING]
    cells[5] = f"{x['target_tokens_per_update']:,.0f} (mean)"  # a mean over the updates, not one batch's count
    return cells


def render_trainer(r: dict[str, Any]) -> list[str]:
    """The ``trainer`` section's results as Markdown lines."""
    c = r.get("corpus") or {}
    out = [
        f"`{r.get('model')}` through `Trainer.train_step` (its data path, `train.precision=auto`), "
        f"`train.max_tokens={r.get('max_tokens')}`, vocabulary {r.get('vocab')} (ids of the "
        f"{r.get('tokenizer_vocab')}-piece tokenizer); corpus: {r.get('corpus_from')}: {c.get('pairs')} pairs, "
        f"target mean {c.get('mean_tgt_len')} pieces, 99th percentile {c.get('tgt_len_p99')}, longest "
        f"{c.get('max_tgt_len')}, {cell(c.get('share_tgt_ge_128'), '{:.2%}')} of 128 or more. MFU against "
        f"{cell(r.get('peak_bf16_tflops'), '{:.4g}')} TFLOP/s ({r.get('peak_source')}), real tokens only.",
        "",
    ]
    t = r.get("target")
    if t:
        out += [
            f"Target: {t['what']} >= {100 * t['bound']:.0f}%: {cell(t['value'], '{:.1%}')} **{t['status']}** "
            f"{t['detail']}".rstrip(),
            "",
        ]
    rows = [
        {**x, "compile": f"{x['compile']}" + (f" ({x['backend']})" if x.get("backend") else ""), "graphs": _graphs(x)}
        if "tok_s" in x
        else [cell(x["mode"]), _why(x)]
        for x in r.get("rows", [])
    ]
    return out + columns(TRAINER, "llllrrrrrrrrrlr", rows)
