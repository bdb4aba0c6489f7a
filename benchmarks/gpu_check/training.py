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


def cpu_reference(ctx: Context, family: str, precision: str, steps: int) -> dict[str, Any]:
    """The first ``steps`` updates' losses of the same config on the CPU, eager (cached per precision)."""
    key = f"{family}/{precision}"
    if key in ctx.cpu_refs:
        return ctx.cpu_refs[key]
    ref_precision, note = precision, ""
    if precision == "bf16" and not (cpu_has_fast_bf16() or ctx.args.quick):
        ref_precision = "fp32"
        note = (
            "this CPU has no fast bf16 (AMX / AVX512-BF16): bf16 would be emulated, ~100x slower, so the "
            "bf16 run is compared with the fp32 CPU loss"
        )
    if ref_precision != precision:
        ref = dict(cpu_reference(ctx, family, ref_precision, steps))
        ref["note"] = note
        ctx.cpu_refs[key] = ref
        return ref
    cfg = run_config(ctx, f"cpu_ref_{precision}", family, precision, False, steps, "cpu")
    trainer = make_trainer(cfg, load_data(ctx), torch.device("cpu"))
    batches = trainer.batches()  # the trainer's own batch order (the sampler seeded by cfg.seed)
    t = time.time()
    losses = [read_stats(trainer.train_step([next(batches)]))["loss"] for _ in range(steps)]
    ref = {
        "precision": ref_precision,
        "losses": losses,
        "seconds": time.time() - t,
        "threads": torch.get_num_threads(),
        "note": note,
    }
    ctx.cpu_refs[key] = ref
    return ref


def judge_run(sec: dict[str, Any], name: str, run: dict[str, Any], ref: dict[str, Any], precision: str) -> None:
    """The run's checks: finite, falling, first-update loss vs the CPU within the precision's tolerance."""
    losses = run["losses"]
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    k = max(1, min(3, len(losses) // 4))
    head = statistics.mean(losses[:k]) if losses else math.nan
    tail = statistics.mean(losses[-k:]) if losses else math.nan
    falling = finite and tail < 0.95 * head
    tol = 1e-4 if precision == "fp32" else 1e-2
    cpu_first = ref["losses"][0]
    rel = abs(losses[0] - cpu_first) / abs(cpu_first) if losses else math.inf
    run.update(
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        cpu_first_loss=cpu_first,
        cpu_precision=ref["precision"],
        first_loss_rel_diff=rel,
        tolerance=tol,
    )
    n = min(len(ref["losses"]), len(losses))
    run["cpu_loss_rel_diff_by_update"] = [abs(a - b) / abs(b) for a, b in zip(losses[:n], ref["losses"][:n])]
    check(sec, f"{name}: losses finite", finite, f"{len(losses)} updates")
    check(sec, f"{name}: losses falling", falling, f"mean of first {k} {head:.4f} -> last {k} {tail:.4f}")
    check(
        sec,
        f"{name}: first-update loss = CPU's (rel. tol {tol:g})",
        rel <= tol,
        f"{losses[0]:.6f} vs CPU {ref['precision']} {cpu_first:.6f}: rel diff {rel:.2e}" if losses else "no loss",
    )


def train_and_judge(
    ctx: Context,
    sec: dict[str, Any],
    report: Report,
    name: str,
    precision: str,
    compile_on: bool,
    updates: int,
    need_s: float,
) -> Any:
    """One device run + its CPU reference, recorded in ``sec`` as soon as it is done; a run that
    raises is recorded with its error (a failed check) and the section goes on."""
    runs = sec["results"].setdefault("runs", {})
    try:
        ctx.budget.need(need_s, name)
        cfg = run_config(ctx, name, "encoder-decoder", precision, compile_on, updates, ctx.device.type)
        ref = cpu_reference(ctx, "encoder-decoder", precision, ctx.args.cpu_ref_steps)
        sec["results"]["cpu_references"] = ctx.cpu_refs
        trainer, run = fit_run(ctx, cfg)
    except Stopped:
        raise
    except OutOfTime as err:  # a skip, not a failure: the report lists it with the budget's other refusals
        runs[name] = ctx.runs[name] = {"run": name, "skipped": str(err)}
        sec["notes"].append(str(err))
        report.write()
        return None
    except Exception as err:  # the run failed
        what = one_line(err)
        runs[name] = {"run": name, "error": what, "traceback": traceback.format_exc(limit=12)[-3000:]}
        check(sec, f"{name}: run", False, what)
        report.write()
        return None
    run["run"] = name
    if ref.get("note"):
        run["cpu_reference_note"] = ref["note"]
        sec["notes"].append(f"{name}: {ref['note']}")
    judge_run(sec, name, run, ref, precision)
    runs[name] = run
    ctx.runs[name] = run
    report.write()
    return trainer


def section_training(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """fp32 and bf16, compile off (the fp32 run is the decoding model)."""
    a = ctx.args
    sliced = f" (first {QUICK_SLICE['train']} training pairs)" if a.quick else ""
    sec["results"]["summary"] = [
        f"Model `{' '.join(model_overrides(ctx, 'encoder-decoder'))}`, Multi30k en-de{sliced}, "
        f"`train.max_tokens={600 if a.quick else 4096}`; CPU references of {a.cpu_ref_steps} updates."
    ]
    trainer = train_and_judge(ctx, sec, report, "fp32", "fp32", False, a.decode_updates, 30)
    if trainer is not None:
        ctx.decode_trainer = trainer
    train_and_judge(ctx, sec, report, "bf16", "bf16", False, a.updates, 20)
    if all("skipped" in x for x in sec["results"]["runs"].values()):
        raise OutOfTime(sec["results"]["runs"]["fp32"]["skipped"])


def section_training_compile(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """``--compile-precision`` (bf16, fp32) with ``train.compile=true``; skipped as a whole when
    no run fits the budget."""
    if ctx.device.type == "cuda" and importlib.util.find_spec("triton") is None:
        raise RuntimeError("triton is not installed: torch.compile has no GPU backend")
    need = 20 if ctx.args.quick else 90  # a run on a GPU: compiling, 40 updates, the CPU reference
    for precision in ctx.args.compile_precision:
        train_and_judge(ctx, sec, report, f"{precision}+compile", precision, True, ctx.args.updates, need)
    runs = sec["results"].get("runs", {}).values()
    if runs and all("skipped" in x for x in runs):
        raise OutOfTime(next(iter(runs))["skipped"])


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
