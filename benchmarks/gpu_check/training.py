"""The ``training``, ``training_compile`` and ``decoding`` sections of the GPU check (``benchmarks/gpu_check/``):
the project's own loop on the device against the same config's first updates on the CPU, and the
trained model's greedy and beam hypotheses on the device against a CPU copy of it."""

from __future__ import annotations

import copy
import importlib.util
import math
import statistics
import time
import traceback
from typing import Any

import torch

from benchmarks import one_line, synchronize
from benchmarks.train_step import make_trainer
from transformer.config import GenerationConfig
from transformer.generation import translate_sentences
from transformer.precision import cpu_has_fast_bf16
from transformer.training.step.update_stats import read_stats

from .context import QUICK_SLICE, Context, fit_run, load_data, model_overrides, run_config
from .report import OutOfTime, Report, Stopped, check


def cpu_reference(ctx: Context, precision: str) -> dict[str, Any]:
    """The first ``--cpu-ref-steps`` updates' losses of the same config on the CPU, eager (cached per
    precision). Without ``--quick``, a CPU without fast bf16 (AMX / AVX512-BF16: bf16 emulated, ~100x
    slower) gives a bf16 run the fp32 losses, with a note."""
    if precision == "bf16" and not (cpu_has_fast_bf16() or ctx.args.quick):
        note = "this CPU has no fast bf16 (AMX / AVX512-BF16): the bf16 run is compared with the fp32 CPU loss"
        return {**cpu_reference(ctx, "fp32"), "note": note}
    if precision not in ctx.cpu_refs:
        steps = ctx.args.cpu_ref_steps
        cfg = run_config(ctx, f"cpu_ref_{precision}", "encoder-decoder", precision, False, steps, "cpu")
        trainer = make_trainer(cfg, load_data(ctx), torch.device("cpu"))
        batches = trainer.batches()  # the trainer's own batch order (the sampler seeded by cfg.seed)
        t = time.time()
        losses = [read_stats(trainer.train_step([next(batches)]))["loss"] for _ in range(steps)]
        ref = {"precision": precision, "losses": losses, "seconds": time.time() - t}
        ctx.cpu_refs[precision] = {**ref, "threads": torch.get_num_threads()}
    return ctx.cpu_refs[precision]


def judge_run(sec: dict[str, Any], name: str, run: dict[str, Any], ref: dict[str, Any], precision: str) -> None:
    """The run's checks: finite, falling, first-update loss vs the CPU within the precision's tolerance."""
    losses, cpu = run["losses"] or [math.nan], ref["losses"]
    k = max(1, min(3, len(losses) // 4))
    head, tail = statistics.mean(losses[:k]), statistics.mean(losses[-k:])
    tol = 1e-4 if precision == "fp32" else 1e-2
    rel = abs(losses[0] - cpu[0]) / abs(cpu[0])
    run.update(first_loss=losses[0], last_loss=losses[-1], cpu_first_loss=cpu[0], cpu_precision=ref["precision"])
    run.update(first_loss_rel_diff=rel, tolerance=tol)
    run["cpu_loss_rel_diff_by_update"] = [abs(a - b) / abs(b) for a, b in zip(losses, cpu)]
    finite = all(math.isfinite(x) for x in losses)
    falling = finite and tail < 0.95 * head
    check(sec, f"{name}: losses finite", finite, f"{len(run['losses'])} updates")
    check(sec, f"{name}: losses falling", falling, f"mean of first {k} {head:.4f} -> last {k} {tail:.4f}")
    detail = f"{losses[0]:.6f} vs CPU {ref['precision']} {cpu[0]:.6f}: rel diff {rel:.2e}"
    check(sec, f"{name}: first-update loss = CPU's (rel. tol {tol:g})", rel <= tol, detail)


def section_training(sec: dict[str, Any], ctx: Context, report: Report, compile_on: bool = False) -> None:
    """fp32 and bf16, compile off (the fp32 run is the decoding model); with ``compile_on``,
    ``--compile-precision`` with ``train.compile=true``. Each run with its CPU reference is recorded as
    soon as it is done; one that raises is a failed check and the next runs; skipped as a whole when
    no run fits the budget."""
    a, runs = ctx.args, sec["results"].setdefault("runs", {})
    sec["results"]["cpu_references"] = ctx.cpu_refs  # filled as the runs need them
    if compile_on and ctx.device.type == "cuda" and importlib.util.find_spec("triton") is None:
        raise RuntimeError("triton is not installed: torch.compile has no GPU backend")
    plan = [("fp32", "fp32", a.decode_updates, 30), ("bf16", "bf16", a.updates, 20)]  # (name, precision, updates, s)
    if compile_on:  # a run on a GPU: compiling, 40 updates, the CPU reference
        plan = [(f"{p}+compile", p, a.updates, 90) for p in a.compile_precision]
    sliced = f" (first {QUICK_SLICE['train']} training pairs)" if a.quick else ""
    sec["results"]["summary"] = [
        f"Model `{' '.join(model_overrides(ctx, 'encoder-decoder'))}`, Multi30k en-de{sliced}, "
        f"`train.max_tokens={600 if a.quick else 4096}`; CPU references of {a.cpu_ref_steps} updates."
    ]
    for name, precision, updates, need_s in plan:
        try:
            ctx.budget.need(need_s, name)
            cfg = run_config(ctx, name, "encoder-decoder", precision, compile_on, updates, ctx.device.type)
            ref = cpu_reference(ctx, precision)
            trainer, run = fit_run(ctx, cfg)
        except Stopped:
            raise
        except OutOfTime as err:  # a skip, not a failure: the report lists it with the budget's other refusals
            runs[name] = {"run": name, "skipped": str(err)}
        except Exception as err:  # the run failed
            runs[name] = {"run": name, "error": one_line(err), "traceback": traceback.format_exc(limit=12)[-3000:]}
            check(sec, f"{name}: run", False, runs[name]["error"])
        else:
            runs[name] = {"run": name, **run, "cpu_reference_note": ref.get("note")}
            judge_run(sec, name, runs[name], ref, precision)
            if name == "fp32":
                ctx.decode_trainer = trainer
        ctx.runs[name] = runs[name]
        report.write()
    if runs and all("skipped" in x for x in runs.values()):
        raise OutOfTime(next(iter(runs.values()))["skipped"])


def section_training_compile(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """The ``training_compile`` section: :func:`section_training` with ``train.compile=true``."""
    section_training(sec, ctx, report, compile_on=True)


# ----------------------------------------------------------------------------- decoding parity


def hyp_tokens(hyps: list[list[Any]]) -> list[list[int]]:
    """The best hypothesis's ids of every sentence ([] when none)."""
    return [list(h[0].tokens) if h else [] for h in hyps]


def section_decoding(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Greedy and beam 5, fp32, the device against a CPU copy of the same weights."""
    if ctx.decode_trainer is None and "skipped" in ctx.runs.get("fp32", {}):
        raise OutOfTime(f"no trained model: {ctx.runs['fp32']['skipped']}")
    if ctx.decode_trainer is None:
        raise RuntimeError("no trained model: the training section's fp32 run did not finish")
    ctx.budget.need(10, "decoding")
    data = load_data(ctx)
    model = ctx.decode_trainer.model.eval()
    cpu_model = copy.deepcopy(model).to("cpu").eval()
    split = data.splits.get("test_2016_flickr") or data.splits["test"]
    n = min(ctx.args.sentences, len(split))
    src = [list(split.src[i]) for i in range(n)]
    tok = data.tgt_tokenizer
    r = sec["results"]
    r.update(sentences=n, split=split.name, model_updates=ctx.decode_trainer.update, searches=[])
    r["summary"] = [f"{n} sentences of {split.name}, the fp32 run's model after {ctx.decode_trainer.update} updates."]
    for search, beam in (("greedy", 1), ("beam", 5)):
        gen = GenerationConfig(strategy=search, beam_size=beam)
        out: dict[str, Any] = {"search": f"{search}{'' if beam == 1 else f' {beam}'}"}
        hyps = {}
        for name, m, dev in (("device", model, ctx.device), ("cpu", cpu_model, torch.device("cpu"))):
            t = time.time()
            with torch.inference_mode():
                hyps[name] = translate_sentences(m, src, gen, dev)
            synchronize(dev)
            out[f"{name}_s"] = time.time() - t
        a, b = hyp_tokens(hyps["device"]), hyp_tokens(hyps["cpu"])
        diff = [i for i in range(n) if a[i] != b[i]]
        out.update(equal=n - len(diff), of=n, mean_len=statistics.mean(len(x) for x in a) if a else 0)
        out["differing"] = [
            {
                "line": i,
                "source": split.src_text[i].rstrip("\n") if split.src_text else None,
                "device": tok.decode(a[i]),
                "cpu": tok.decode(b[i]),
                "device_score": hyps["device"][i][0].score if hyps["device"][i] else None,
                "cpu_score": hyps["cpu"][i][0].score if hyps["cpu"][i] else None,
            }
            for i in diff[:5]
        ]
        if diff:
            d = out["differing"][0]
            out["first_difference"] = f"line {d['line']}: device `{d['device']}` vs CPU `{d['cpu']}`"
        r["searches"].append(out)
        check(sec, f"{out['search']}: device = CPU", not diff, f"{n - len(diff)}/{n} hypotheses equal")
        report.write()
