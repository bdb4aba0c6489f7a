""":meth:`~transformer.training.loop.trainer.Trainer.train_step` itself at WMT sizes, on its own data
path: the ``trainer`` section of the GPU check (``docs/gpu.md``, "The trainer's own update"). Data:
Multi30k's pairs joined to WMT-like lengths (:func:`wmt_like_split`) at a ``--trainer-vocab``
vocabulary; modes eager, compiled, and DDP over a one-rank process group.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from benchmarks import release, reset_peak, synchronize
from benchmarks.train_step import VocabSize, make_trainer
from transformer.data.binarize import TokenSequences
from transformer.data.dataset import ParallelDataset, TranslationData
from transformer.data.tokenizer import PAD_ID
from transformer.training.distributed.process_group import shutdown_distributed
from transformer.training.step import compiled
from transformer.training.step.update_stats import read_stats

from .batches import real_train_flops
from .context import Context, load_data, run_config
from .presets import MODELS, model_config
from .realistic import at_smoke_sizes, best, bf16_peak, mfu_target
from .report import OutOfTime, Report, check, guarded

MODES = ("eager", "compiled", "ddp", "ddp-compiled")
NEED_S = {"eager": 25, "compiled": 150, "ddp": 25, "ddp-compiled": 150}  # on a GPU, data and compile included
MAX_SIDE = 250  # pieces a side of a joined pair: the usual WMT cleaning limit, under data.max_*_positions


# ----------------------------------------------------------------------------- data


def _flat(seqs: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, offsets)`` of a split side: sequence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``."""
    lengths = np.asarray([len(s) for s in seqs], dtype=np.int64)
    tokens = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(lengths.sum()))
    return tokens, np.concatenate([[0], np.cumsum(lengths)])


def wmt_like_split(split: ParallelDataset, mean_len: float, seed: int = 0, max_side: int = MAX_SIDE) -> ParallelDataset:
    """Consecutive pairs of ``split`` (ids without specials) joined, source after source and target
    after target, into pairs whose targets average about ``mean_len`` pieces with a geometric tail:
    runs of ``k`` pairs, ``k`` geometric of mean ``mean_len / mean target length`` (drawn with
    ``seed``), cut short where a side would pass ``max_side`` pieces; every pair used once, in order.
    Returns a :class:`~transformer.data.dataset.ParallelDataset` named ``split.name``.

    Raises:
        ValueError: ``split`` is empty or ``mean_len`` is not positive.
    """
    if len(split) == 0 or not mean_len > 0:
        raise ValueError(f"cannot join {len(split)} pairs to a mean length of {mean_len}")
    src_len, tgt_len = split.src_lengths, split.tgt_lengths
    per_pair = max(1.0, mean_len / float(tgt_len.mean()))
    runs = np.random.default_rng(seed).geometric(1.0 / per_pair, size=len(split))
    starts, i, n = [], 0, len(split)
    for k in runs:
        if i >= n:
            break
        starts.append(i)
        s, t, j = src_len[i], tgt_len[i], i + 1
        while j < min(n, i + int(k)) and s + src_len[j] <= max_side and t + tgt_len[j] <= max_side:
            s, t, j = s + src_len[j], t + tgt_len[j], j + 1
        i = j
    while i < n:  # the draws ran out (only when most runs were cut short): one pair each
        starts.append(i)
        i += 1
    bounds = np.asarray(starts + [n], dtype=np.int64)
    sides = []
    for seqs in (split.src, split.tgt):
        tokens, offsets = _flat(seqs)
        sides.append(TokenSequences(tokens, offsets[bounds]))
    return ParallelDataset(sides[0], sides[1], None, None, split.name)


def length_summary(split: ParallelDataset) -> dict[str, Any]:
    """Pairs, mean and largest lengths, and the share of targets of 64 and 128 pieces or more."""
    src, tgt = split.src_lengths, split.tgt_lengths
    return {
        "pairs": len(split),
        "mean_src_len": round(float(src.mean()), 2),
        "mean_tgt_len": round(float(tgt.mean()), 2),
        "max_tgt_len": int(tgt.max()),
        "tgt_len_p99": int(np.percentile(tgt, 99)),
        "share_tgt_ge_64": round(float((tgt >= 64).mean()), 4),
        "share_tgt_ge_128": round(float((tgt >= 128).mean()), 4),
    }


def wmt_like_data(ctx: Context) -> TranslationData:
    """Multi30k with its training split joined to WMT-like lengths (:func:`wmt_like_split`) and the
    tokenizers widened to ``--trainer-vocab`` entries (the trainer sizes the embeddings and the output
    layer by them; the ids stay the tokenizer's, a subset); built once."""
    if ctx.trainer_data is None:
        data = load_data(ctx)
        vocab = max(ctx.args.trainer_vocab, len(data.src_tokenizer), len(data.tgt_tokenizer))
        src = VocabSize(vocab, data.src_tokenizer)
        tgt = src if data.joint_vocab else VocabSize(vocab, data.tgt_tokenizer)
        train = wmt_like_split(data.splits["train"], ctx.args.trainer_mean_len)
        ctx.trainer_data = TranslationData(src, tgt, {"train": train, "valid": data.splits["valid"]})
    return ctx.trainer_data


# ----------------------------------------------------------------------------- one row


def time_updates(trainer: Any, warmup: int, updates: int, device: torch.device) -> dict[str, Any]:
    """The first update alone, ``warmup`` more, then ``updates`` timed together (the device
    synchronised at both ends, nothing read on the host between them).

    Returns:
        ``seconds`` and ``graphs`` (dynamo graphs compiled) of the three parts, ``stats`` (the timed
        updates' :meth:`Trainer.train_step` results) and ``batches`` (the timed batches).
    """
    freq = trainer.cfg.train.update_freq
    batches = trainer.batches()  # the trainer's own data path: prefetching, pinned, non_blocking
    out: dict[str, Any] = {"seconds": [], "graphs": [], "stats": [], "batches": []}
    try:
        for n, keep in ((1, False), (warmup, False), (updates, True)):
            before = compiled.compiled_graphs()
            synchronize(device)
            t = time.perf_counter()
            for _ in range(n):
                micro = [next(batches) for _ in range(freq)]
                stats = trainer.train_step(micro)
                if keep:
                    out["stats"].append(stats)
                    out["batches"] += micro
            synchronize(device)
            out["seconds"].append(time.perf_counter() - t)
            out["graphs"].append(compiled.compiled_graphs() - before)
    finally:
        batches.close()  # stops the prefetching thread
    return out


def measure(ctx: Context, mode: str, peak: float) -> dict[str, Any]:
    """One row (``docs/gpu.md``, "The trainer's own update"); raises what the row raised."""
    a, dev = ctx.args, ctx.device
    data = wmt_like_data(ctx)
    _, _, over = model_config(a.trainer_model, a.quick)  # the preset, train.precision=auto, no checkpoints
    own = [f"model={MODELS[a.trainer_model][0]}", *over, f"train.max_tokens={a.trainer_tokens}", "train.average_last=0"]
    updates = 1 + a.trainer_warmup + a.trainer_updates
    cfg = run_config(ctx, f"trainer_{mode}", "", "auto", mode.endswith("compiled"), updates, dev.type, own)
    backend = "eager" if a.quick and dev.type == "cpu" else "inductor"
    trainer, ddp = None, mode.startswith("ddp")
    try:
        reset_peak(dev)
        if ddp:  # DDP over a process group of this process alone: the trainer's own engine
            dist.init_process_group(
                "nccl" if dev.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
            )
        try:
            trainer = make_trainer(cfg, data, dev, "ddp" if ddp else None, backend)
            r = time_updates(trainer, a.trainer_warmup, a.trainer_updates, dev)
        finally:
            if ddp:
                torch._dynamo.reset()  # compiled graphs hold the DDP module
                shutdown_distributed(trainer and trainer.parallel)  # DDP's reducer goes before its process group
        last, ntokens = read_stats(r["stats"][-1]), sum(int(s["ntokens"]) for s in r["stats"])
        batches = r.pop("batches")  # the rows' lengths without BOS / EOS, and the targets' padded size
        src = torch.cat([b.net_input["src_tokens"].ne(PAD_ID).sum(1) for b in batches]).cpu().numpy() - 1
        tgt = torch.cat([b.target.ne(PAD_ID).sum(1) for b in batches]).cpu().numpy() - 1
        padded = sum(b.target.numel() for b in batches)
        flops = real_train_flops(cfg.model, src, tgt, len(data.tgt_tokenizer))
        first_s, _, timed_s = r["seconds"]
        per_update = timed_s / a.trainer_updates
        row = {
            "system": "Trainer.train_step",
            "precision": trainer.precision,
            "compile": trainer.compiled and backend,
            "distributed": "ddp, 1-rank group" if mode.startswith("ddp") else "none (one process)",
            "prefetch": trainer.prefetch,
            "pad_to_multiple": trainer.pad_to_multiple,
            "params": sum(p.numel() for p in trainer.model.parameters()),
            "first_step_s": first_s,
            "compile_s": max(first_s - per_update, 0.0) if trainer.compiled else None,
            "timed_s": timed_s,
            "step_ms": 1e3 * per_update,
            "tok_s": ntokens / timed_s,
            "target_tokens": ntokens / a.trainer_updates,  # per update, a mean
            "dims": f"WMT-like, {len(tgt) / a.trainer_updates:.0f} rows, mean target {float(tgt.mean()) + 1:.1f}",
            "padding": 1 - (int(tgt.sum()) + len(tgt)) / max(padded, 1),
            "train_flops": flops,
            "mfu": flops / timed_s / peak,
            "graph_counts": r["graphs"],  # first update, warm-up, timed
            "graphs": " / ".join(map(str, r["graphs"])) if trainer.compiled else None,
            "last_loss": last["loss"],
        }
        if dev.type == "cuda":
            row["mem_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
        return row
    finally:
        del trainer
        if mode.endswith("compiled"):
            torch._dynamo.reset()  # the next rows and sections compile their own graphs afresh
        release(dev)


# ----------------------------------------------------------------------------- the section


def section_trainer(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """The trainer's own update at WMT sizes, one row per mode, each guarded and budgeted."""
    a = ctx.args
    r = sec["results"]
    peak, source = bf16_peak(ctx)
    r.update(model=a.trainer_model, max_tokens=a.trainer_tokens, peak_bf16_tflops=peak / 1e12, rows=[])
    report.write()
    for mode in a.trainer_modes:
        row: dict[str, Any] = {"model": a.trainer_model, "mode": mode, "max_tokens": a.trainer_tokens}
        with guarded(row, traceback_limit=8):
            ctx.budget.need(NEED_S[mode], f"trainer {a.trainer_model} {mode}")
            if "corpus" not in r:  # built for the first row that runs (the data load is in its time)
                data = wmt_like_data(ctx)
                c = r["corpus"] = length_summary(data.splits["train"])
                r["summary"] = [
                    f"`{a.trainer_model}` through `Trainer.train_step` (its data path, `train.precision=auto`), "
                    f"`train.max_tokens={a.trainer_tokens}`, vocabulary {len(data.tgt_tokenizer)} (ids of the "
                    f"{len(data.tgt_tokenizer.inner)}-piece tokenizer); corpus: Multi30k en-de training pairs"
                    f"{' (a slice)' if a.quick else ''} joined to a target mean of {a.trainer_mean_len:g} pieces: "
                    f"{c['pairs']} pairs, target mean {c['mean_tgt_len']}, 99th percentile {c['tgt_len_p99']}, "
                    f"longest {c['max_tgt_len']}, {c['share_tgt_ge_128']:.2%} of 128 or more. MFU against "
                    f"{peak / 1e12:.4g} TFLOP/s ({source}), real tokens only."
                ]
            row.update(measure(ctx, mode, peak))
        r["rows"].append(row)
        ctx.trainer_rows.append(row)
        report.write()
    measured = [x for x in r["rows"] if "tok_s" in x]
    if not measured and all("skipped" in x for x in r["rows"]):
        raise OutOfTime(r["rows"][0]["skipped"] if r["rows"] else "no mode asked for")
    if a.trainer_model == "base":  # the targets name the base model; a smoke run's tiny batches read at their size
        min_tokens = a.trainer_tokens if a.quick else 16384
        r["targets"] = [mfu_target("base_trainer_mfu", best(measured, min_tokens=min_tokens))]
        if a.quick:
            r["targets"] = at_smoke_sizes(r["targets"])
    check(sec, "rows measured", bool(measured), f"{len(measured)} of {len(r['rows'])} modes measured")
    for x in measured:
        check(sec, f"{x['mode']}: loss finite", math.isfinite(x["last_loss"]), f"last loss {x['last_loss']:.4f}")
        if x["compile"]:
            first, warmup, timed = x["graph_counts"]
            detail = f"graphs compiled: first update {first}, warm-up {warmup}, timed {timed}"
            check(sec, f"{x['mode']}: no recompilation while timed", timed == 0, detail)
    failed = [x["mode"] for x in r["rows"] if "error" in x]
    if failed:
        check(sec, "no row failed", False, "failed: " + ", ".join(failed))
