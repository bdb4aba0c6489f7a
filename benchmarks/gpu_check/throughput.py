"""The ``throughput`` section of the GPU check (``benchmarks/gpu_check/``): ``benchmarks/train_step.py``'s models,
batches and FLOP count in this process, ours beside the HF peers, with MFU against the device's peak."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks import one_line
from benchmarks.train_step import (
    PRESET_OVERRIDES,
    SIZES,
    SRC_LEN,
    TGT_LEN,
    cuda_matmul_peak,
    flops_peak,
    measure,
    preset,
    train_flops,
)

from .context import Context
from .report import OutOfTime, Report, Stopped, check


def section_throughput(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Ours vs HF at tiny / small / base, fp32 and bf16: tokens/s, MFU, peak memory."""
    a, dev = ctx.args, ctx.device
    r = sec["results"]
    found = {prec: flops_peak(dev, prec, reps=5 if dev.type == "cuda" else 2) for prec in ("bf16", "fp32")}
    peaks = {prec: peak for prec, (peak, _) in found.items()}
    source = {prec: where for prec, (_, where) in found.items()}
    if dev.type == "cuda":  # the probe beside the table, to see how close the table is
        r["measured_matmul_tflops"] = {
            p: cuda_matmul_peak(dev, d) / 1e12 for p, d in (("bf16", torch.bfloat16), ("fp32", torch.float32))
        }
    r.update(
        device_name=ctx.meta_device,
        peaks_tflops={k: v / 1e12 for k, v in peaks.items()},
        peak_source=source,
        batch={"rows": a.rows, "src_len": SRC_LEN, "tgt_len": TGT_LEN},
        warmup=a.warmup,
        steps=a.steps,
        rows=[],
    )
    report.write()
    peers = {"encoder-decoder": a.encdec_peers, "decoder-only": a.decoder_peers}
    common = {"rows": a.rows, "src_len": SRC_LEN, "tgt_len": TGT_LEN, "warmup": a.warmup, "steps": a.steps}
    for size in a.sizes:
        ed, do, _ = SIZES[size]
        for family, preset_name in (("encoder-decoder", ed), ("decoder-only", do)):
            over = PRESET_OVERRIDES.get((size, family), [])
            cfg, _ = preset(preset_name, over)
            flops = train_flops(cfg, a.rows, SRC_LEN, TGT_LEN)
            for prec in a.precision:
                ours_row = None
                for model in ["ours", *peers[family]]:
                    row: dict[str, Any] = {"size": size, "family": family, "model": model, "precision": prec}
                    row.update(preset=preset_name, overrides=over)
                    own = ["model.dropout=0.0"] if family == "decoder-only" and model == "ours" else []
                    spec = {**common, "model": model, "preset": preset_name, "precision": prec, "overrides": over + own}
                    try:
                        ctx.budget.need(10 if a.quick else 12, f"{size} {family} {model} {prec}")
                        m = measure(spec, dev)
                        tok_s = a.rows * TGT_LEN / m["step_s"]
                        row.update(
                            tok_s=tok_s,
                            step_ms=1e3 * m["step_s"],
                            best_ms=1e3 * m["best_s"],
                            mfu_vs_bf16_peak=flops / m["step_s"] / peaks["bf16"],
                            mfu_vs_dtype_peak=flops / m["step_s"] / peaks[prec],
                            mem_mb=m.get("mem_mb"),
                            params=m["params"],
                            dropout=m["dropout"],
                            train_flops_per_step=flops,
                        )
                        if model == "ours":
                            ours_row = row
                        elif ours_row is not None:
                            row["ratio_to_ours"] = tok_s / ours_row["tok_s"]
                    except Stopped:
                        raise
                    except OutOfTime as err:
                        row["skipped"] = row["out_of_time"] = str(err)
                    except Exception as err:
                        row["skipped"] = one_line(err, 300)
                        if model == "ours":
                            check(sec, f"{size} {family} ours {prec}", False, row["skipped"])
                    r["rows"].append(row)
                    report.write()
    measured = [x for x in r["rows"] if "tok_s" in x and x["model"] == "ours"]
    if not measured and r["rows"] and all("out_of_time" in x for x in r["rows"]):
        raise OutOfTime(r["rows"][0]["out_of_time"])
    check(sec, "our rows measured", bool(measured), f"{len(measured)} of ours measured")
