"""The ``realistic`` section of the GPU check (``docs/gpu.md``, "The realistic-size table"): training
steps of :data:`.presets.MODELS` on :mod:`.batches`' Multi30k-like batches, ours beside the HF peers,
eager / compiled / CUDA graphs, then decoding (:mod:`.realistic_decoding`), rows in :func:`plan`'s
order, each guarded and budgeted. ``--quick`` compiles with dynamo's eager backend, no CUDA graphs.
"""

from __future__ import annotations

import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import peers, release, reset_peak, synchronize
from benchmarks.train_step import Ours, dims, flops_peak, make_optimizer, our_dropout

from .batches import describe, make_tensors, real_train_flops, representative_batch
from .context import Context, load_data
from .presets import MODELS, model_config
from .realistic_decoding import decode_jobs
from .report import Budget, OutOfTime, Report, check, guarded
from .targets import evaluate_targets

MODES = ("eager", "compiled", "cudagraphs")
NEED_S = {"eager": 12, "compiled": 80, "cudagraphs": 90}  # seconds a row needs on a GPU (compile included)
QUICK_NEED_S = {"eager": 2, "compiled": 10, "cudagraphs": 10}


def plan(models: list[str], tokens: list[int], modes: list[str], systems: dict[str, list[str]]) -> list[tuple]:
    """The rows in the order they run: ``("train", model, max_tokens, mode, system)`` and one
    ``("decode",)``. Priority: eager at the first batch size; decoding; the encoder-decoders compiled
    at the first batch size; eager at the others; the rest (by batch size)."""
    rows = [("train", m, t, mode, s) for t in tokens for m in models for mode in modes for s in systems[MODELS[m][2]]]

    def tier(r: tuple) -> tuple:
        _, m, t, mode, s = r
        first = t == tokens[0]
        enc_dec = MODELS[m][2] == "encoder-decoder"
        rank = 0 if mode == "eager" and first else 2 if first and enc_dec else 3 if mode == "eager" else 4
        return (rank, tokens.index(t), models.index(m), modes.index(mode), systems[MODELS[m][2]].index(s))

    rows.sort(key=tier)
    cut = sum(1 for r in rows if tier(r)[0] == 0)
    return rows[:cut] + [("decode",)] + rows[cut:]


def _masked_seq2seq_loss(self: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """HF Marian's loss with the source padding mask (what an HF training loop passes)."""
    labels = batch["target"].masked_fill(batch["target"].eq(peers.PAD), -100)
    return self.core(
        input_ids=batch["src"],
        attention_mask=batch["src"].ne(peers.PAD),
        decoder_input_ids=batch["prev"],
        labels=labels,
    ).loss


def build(system: str, cfg: Any, vocab: int) -> torch.nn.Module:
    """Ours (model + the trainer's fused label-smoothed loss) or a peer of ``benchmarks/peers.py``."""
    if system == "ours":
        return Ours(cfg, vocab=vocab)
    peers.preload(system)
    table = peers.encdec_peers() if cfg.arch == "encoder_decoder" else peers.decoder_only_peers()
    module = table[system](dims(cfg), vocab)
    if isinstance(module, peers.HFSeq2SeqPeer):
        module.step_loss = types.MethodType(_masked_seq2seq_loss, module)
    return module


def loss_fn(module: torch.nn.Module, mode: str, backend: str) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The row's loss function: eager, or compiled (``reduce-overhead`` for ``cudagraphs``)."""
    if mode == "eager":
        return module.step_loss
    torch._dynamo.reset()  # a fresh cache per row: no recompile limit reached across rows
    kwargs = {"mode": "reduce-overhead"} if mode == "cudagraphs" else {}
    return torch.compile(module.step_loss, backend=backend, **kwargs)


def time_row(
    module: torch.nn.Module,
    fn: Callable,
    batch: dict[str, torch.Tensor],
    opt: Any,
    warmup: int,
    steps: int,
    device: torch.device,
    cudagraphs: bool,
) -> dict[str, Any]:
    """Step times (s): the warm-up steps' (the first compiles) and the median and best of ``steps``."""
    module.train()

    def step() -> float:
        synchronize(device)
        t = time.perf_counter()
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = fn(batch)
        loss.backward()
        opt.step()
        synchronize(device)
        return time.perf_counter() - t

    warm = [step() for _ in range(warmup)]
    times = sorted(step() for _ in range(steps))
    return {"step_s": statistics.median(times), "best_s": times[0], "warmup_s": warm}


def measure(
    name: str, system: str, mode: str, max_tokens: int, ctx: Context, lengths: dict[str, Any]
) -> dict[str, Any]:
    """One training row (``docs/gpu.md``, "The realistic-size table"); raises what the row raised."""
    a, dev = ctx.args, ctx.device
    cfg, optim_cfg, over = model_config(name, a.quick)
    vocab = a.realistic_vocab
    lb = lengths[(cfg.arch, max_tokens)]
    tensors = make_tensors(lb, cfg.arch, vocab)
    row: dict[str, Any] = {"batch": describe(lb, tensors), "overrides": over}
    flops = real_train_flops(cfg, lb, vocab)
    module = opt = None
    try:
        before = reset_peak(dev)
        torch.manual_seed(0)
        module = build(system, cfg, vocab).to(dev)
        batch = {k: v.to(dev) for k, v in tensors.items()}
        opt = make_optimizer(module, optim_cfg, dev.type)
        backend = "eager" if a.quick and dev.type == "cpu" else "inductor"
        fn = loss_fn(module, mode, backend)
        if mode != "eager":
            from torch._dynamo.utils import counters

            counters.clear()
        r = time_row(module, fn, batch, opt, a.realistic_warmup, a.realistic_steps, dev, mode == "cudagraphs")
        row.update(
            r,
            params=sum(p.numel() for p in module.parameters()),
            train_flops=flops,
            tok_s=lb.target_tokens / r["step_s"],
            first_step_s=r["warmup_s"][0],
            dropout=our_dropout(cfg) if system == "ours" else getattr(module, "dropout_desc", "?"),
        )
        if mode != "eager":
            row.update(
                backend=backend,
                graphs=int(counters["stats"].get("unique_graphs", 0)),
                graph_breaks=int(sum(counters["graph_break"].values())),
            )
        if dev.type == "cuda":
            row["mem_mb"] = (torch.cuda.max_memory_allocated(dev) - before) / 2**20
        return row
    finally:
        del module, opt
        if mode != "eager":
            torch._dynamo.reset()
        release(dev)


def bf16_peak(ctx: Context) -> tuple[float, str]:
    """The device's dense bf16 peak (FLOP/s) and where it comes from (found once, kept in ``ctx``)."""
    if ctx.peak is None:
        if ctx.device.type == "cuda":
            ctx.peak = flops_peak(ctx.device, "bf16")
        else:  # a smoke run: fp32, not a bf16 peak
            ctx.peak = (
                flops_peak(ctx.device, "fp32", reps=1)[0],
                "measured fp32 torch.mm on the CPU (not a bf16 peak)",
            )
    return ctx.peak


def section_realistic(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Training rows and decoding in priority order, each guarded, within the section's budget."""
    a, dev = ctx.args, ctx.device
    r = sec["results"]
    budget = Budget(a.realistic_budget_s, ctx.budget.skipped)  # its refusals listed with the check's
    data = load_data(ctx)
    train = data.splits["train"]
    src_l, tgt_l = train.src_lengths, train.tgt_lengths
    lengths = {}
    for arch in {MODELS[m][2].replace("-", "_") for m in a.realistic_models}:
        for t in a.realistic_tokens:
            lengths[(arch, t)] = representative_batch(src_l, tgt_l, t, arch)
    peak, source = bf16_peak(ctx)
    systems = {"encoder-decoder": ["ours", *a.encdec_peers], "decoder-only": ["ours", *a.decoder_peers]}
    modes = [m for m in a.realistic_modes if dev.type == "cuda" or m != "cudagraphs"]
    r.update(
        device_name=ctx.meta_device,
        peak_bf16_tflops=peak / 1e12,
        peak_source=source,
        vocab=a.realistic_vocab,
        precision="bf16 autocast",
        warmup=a.realistic_warmup,
        steps=a.realistic_steps,
        budget_s=a.realistic_budget_s,
        lengths_from=f"{len(train)} training pairs of {'a slice of ' if a.quick else ''}Multi30k en-de "
        f"(vocabulary {len(data.src_tokenizer)})",
        rows=[],
        decoding=[],
    )
    if len(modes) < len(a.realistic_modes):
        sec["notes"].append("cudagraphs rows not run: CUDA graphs need a CUDA device")
    report.write()
    need = QUICK_NEED_S if a.quick else NEED_S
    for job in plan(a.realistic_models, a.realistic_tokens, modes, systems):
        if job[0] == "decode":
            decode_jobs(sec, ctx, report, data, budget)
            continue
        _, name, tokens, mode, system = job
        row: dict[str, Any] = {
            "model": name,
            "family": MODELS[name][2],
            "system": system,
            "mode": mode,
            "max_tokens": tokens,
        }
        with guarded(row):
            what = f"{name} {system} {mode} {tokens}"
            budget.need(need[mode], what)
            ctx.budget.need(need[mode], what)
            row.update(measure(name, system, mode, tokens, ctx, lengths))
            row["mfu"] = row["train_flops"] / row["step_s"] / peak
        r["rows"].append(row)
        report.write()
    # the trainer section's rows (Trainer.train_step on WMT-like batches) shown beside these
    r["trainer_rows"] = [x for x in ctx.trainer_rows if "tok_s" in x]
    # the targets' batch bound (16k tokens); a smoke run's tiny batches are read at its smallest batch
    r["targets"] = evaluate_targets(r["rows"], r["decoding"], min(a.realistic_tokens) if a.quick else 16384)
    ours = [x for x in r["rows"] if x["system"] == "ours" and "tok_s" in x]
    if not ours and r["rows"] and all("skipped" in x for x in r["rows"]):
        raise OutOfTime(f"every row skipped for the time budget ({r['rows'][0]['skipped']})")
    check(sec, "our rows measured", bool(ours), f"{len(ours)} of ours measured")
    failed = [f"{x['model']} {x['system']} {x['mode']} {x['max_tokens']}" for x in r["rows"] if "error" in x]
    if failed:
        sec["notes"].append("rows that failed (their errors are in the table): " + "; ".join(failed))
