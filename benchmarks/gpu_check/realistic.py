"""The ``realistic`` section of the GPU check (``docs/gpu.md``, "The realistic-size table"): training
steps of :data:`.presets.MODELS` on :mod:`.batches`' Multi30k-like batches, ours beside the HF peers,
eager / compiled / CUDA graphs, then decoding (:mod:`.realistic_decoding`), rows in :func:`plan`'s
order, each guarded and budgeted, and the targets they are read against (:data:`TARGETS`).
``--quick`` compiles with dynamo's eager backend, no CUDA graphs.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch._dynamo.utils import counters

from benchmarks import peers, release, reset_peak
from benchmarks.train_step import (
    Ours,
    as_batch,
    flops_peak,
    hand_step,
    make_optimizer,
    our_dropout,
    peer_model,
    time_steps,
    trainer_under_test,
)

from .batches import describe, make_tensors, real_train_flops, representative_batch
from .context import Context, load_data
from .presets import MODELS, model_config
from .realistic_decoding import decode_jobs
from .report import Budget, OutOfTime, Report, check, guarded

NEED_S = {"eager": 12, "compiled": 80, "cudagraphs": 90}  # seconds a row needs on a GPU (compile included)
TARGETS = {  # key: (what, bound, unit)
    "base_mfu": ("transformer_2017_base: bf16 MFU at >= 16k target tokens per batch", 0.35, "MFU"),
    "base_vs_marian": ("transformer_2017_base: target tok/s against HF Marian at the same batch", 1.3, "x"),
    "big_mfu": ("transformer_2017_big: bf16 MFU at >= 16k target tokens per batch", 0.45, "MFU"),
    "beam_vs_hf": ("beam-5 decoding, 1,000 sentences at batch 64: sentences/s against HF generate", 5.0, "x"),
    "base_trainer_mfu": (
        "transformer_2017_base: bf16 MFU through Trainer.train_step (WMT-like, 16k tokens)",
        0.35,
        "MFU",
    ),
}


def plan(models: list[str], tokens: list[int], modes: list[str], systems: dict[str, list[str]]) -> list[tuple]:
    """The rows in the order they run: ``("train", model, max_tokens, mode, system)`` and one
    ``("decode",)``. Priority: eager at the first batch size; decoding; the encoder-decoders compiled
    at the first batch size; eager at the others; the rest (by batch size)."""
    rows = [("train", m, t, mode, s) for t in tokens for m in models for mode in modes for s in systems[MODELS[m][2]]]

    def tier(r: tuple) -> tuple:
        _, m, t, mode, s = r
        first, enc_dec = t == tokens[0], MODELS[m][2] == "encoder-decoder"
        rank = 0 if mode == "eager" and first else 2 if first and enc_dec else 3 if mode == "eager" else 4
        return (rank, tokens.index(t), models.index(m), modes.index(mode), systems[MODELS[m][2]].index(s))

    rows.sort(key=tier)
    cut = sum(1 for r in rows if tier(r)[0] == 0)
    return rows[:cut] + [("decode",)] + rows[cut:]


def _masked_seq2seq_loss(self: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """HF Marian's loss with the source padding mask (what an HF training loop passes)."""
    labels = batch["target"].masked_fill(batch["target"].eq(peers.PAD), -100)
    src = batch["src"]
    return self.core(
        input_ids=src, attention_mask=src.ne(peers.PAD), decoder_input_ids=batch["prev"], labels=labels
    ).loss


def peer(system: str, cfg: Any, vocab: int) -> torch.nn.Module:
    """A peer of ``benchmarks/peers.py`` at ``cfg``'s dims (HF Marian given the source padding mask)."""
    module = peer_model(system, cfg, vocab)
    if isinstance(module, peers.HFSeq2SeqPeer):
        module.step_loss = types.MethodType(_masked_seq2seq_loss, module)
    return module


def row_step(system: str, mode: str, name: str, tensors: dict[str, torch.Tensor], ctx: Context) -> tuple[Any, Any]:
    """``(step, model)`` of one training row on the device, bf16. Ours eager and compiled: the
    trainer's update (:func:`~benchmarks.train_step.trainer_under_test`, ``train.compile`` for
    compiled); ours with CUDA graphs (the trainer has no such mode) and the peers: the model and its
    loss under :func:`~benchmarks.train_step.hand_step`, the loss compiled (``reduce-overhead`` for
    ``cudagraphs``)."""
    a, dev = ctx.args, ctx.device
    cfg, optim_cfg, over = model_config(name, a.quick)
    backend = "eager" if a.quick and dev.type == "cpu" else "inductor"
    batch = {k: v.to(dev) for k, v in tensors.items()}
    torch.manual_seed(0)
    if system == "ours" and mode != "cudagraphs":
        spec = {"preset": MODELS[name][0], "overrides": over, "precision": "bf16", "compile": mode == "compiled"}
        trainer = trainer_under_test({**spec, "backend": backend}, tensors, dev, a.realistic_vocab)
        micro = [as_batch(batch)]
        return (lambda: trainer.train_step(micro)), trainer.model
    module = (Ours(cfg, vocab=a.realistic_vocab) if system == "ours" else peer(system, cfg, a.realistic_vocab)).to(dev)
    loss = module.step_loss
    if mode != "eager":
        compiled = torch.compile(loss, backend=backend, **({"mode": "reduce-overhead"} if mode == "cudagraphs" else {}))

        def loss(b: dict[str, torch.Tensor]) -> torch.Tensor:
            if mode == "cudagraphs":
                torch.compiler.cudagraph_mark_step_begin()  # a new step: the last step's graph outputs are free
            return compiled(b)

    return hand_step(module, batch, make_optimizer(module, optim_cfg, dev.type), "bf16", dev, loss), module


def measure(name: str, system: str, mode: str, max_tokens: int, ctx: Context, lengths: dict) -> dict[str, Any]:
    """One training row (``docs/gpu.md``, "The realistic-size table"), timed by
    :func:`~benchmarks.train_step.time_steps`; raises what the row raised."""
    a, dev = ctx.args, ctx.device
    cfg, _, over = model_config(name, a.quick)
    lb = lengths[(cfg.arch, max_tokens)]
    tensors = make_tensors(lb, cfg.arch, a.realistic_vocab)
    row = {**describe(lb, tensors), "overrides": over}
    step = model = None
    try:
        before = reset_peak(dev)
        torch._dynamo.reset()  # a fresh cache per row: no recompile limit reached across rows
        counters.clear()
        step, model = row_step(system, mode, name, tensors, ctx)
        r = time_steps(step, a.realistic_warmup, a.realistic_steps, dev)
        row.update(r, step_ms=1e3 * r["step_s"], tok_s=lb.target_tokens / r["step_s"], first_step_s=r["warmup_s"][0])
        row.update(
            params=sum(p.numel() for p in model.parameters()),
            train_flops=real_train_flops(cfg, lb.src, lb.tgt, a.realistic_vocab),
            dropout=our_dropout(cfg) if system == "ours" else getattr(model, "dropout_desc", "?"),
        )
        if mode != "eager":
            graphs, breaks = int(counters["stats"].get("unique_graphs", 0)), int(sum(counters["graph_break"].values()))
            row["graphs"] = f"{graphs} / {breaks} breaks"
        if dev.type == "cuda":
            row["mem_mb"] = (torch.cuda.max_memory_allocated(dev) - before) / 2**20
        return row
    finally:
        del step, model
        torch._dynamo.reset()
        release(dev)


def bf16_peak(ctx: Context) -> tuple[float, str]:
    """The device's dense bf16 peak (FLOP/s) and where it comes from (found once, kept in ``ctx``)."""
    if ctx.peak is None:
        ctx.peak = flops_peak(ctx.device, "bf16", reps=5 if ctx.device.type == "cuda" else 1)
    return ctx.peak


def judged(key: str, value: float | None, detail: str = "") -> dict[str, Any]:
    """Target ``key``'s record: its value, ``met``, ``missed`` or ``not measured``, and what it read."""
    what, bound, unit = TARGETS[key]
    spec = "{:.1%}" if unit == "MFU" else "{:.2f}x"
    record = {"target": key, "what": what, "bound": bound, "unit": unit, "value": value, "detail": detail}
    record["status"] = "not measured" if value is None else "met" if value >= bound else "missed"
    shown = None if value is None else spec.format(value)
    return record | {"bound_shown": ">= " + spec.format(bound), "value_shown": shown}


def best(rows: list[dict[str, Any]], key: str = "mfu", min_tokens: int = 0, **match: Any) -> dict[str, Any] | None:
    """The row of ``rows`` matching ``match`` at ``min_tokens`` or more with the highest ``key`` (None: none measured)."""
    found = [x for x in rows if key in x and x["max_tokens"] >= min_tokens and all(x[k] == v for k, v in match.items())]
    return max(found, key=lambda x: x[key]) if found else None


def mfu_target(key: str, row: dict[str, Any] | None) -> dict[str, Any]:
    """An MFU target judged at ``row`` (the best row, or None)."""
    if row is None:
        return judged(key, None)
    return judged(key, row["mfu"], f"{row['mode']}, {row['max_tokens']} tokens: {100 * row['mfu']:.1f}%")


def at_smoke_sizes(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``targets`` judged on a ``--quick`` run: their details say that the sizes are the smoke run's,
    not the ones the targets name."""
    return [
        t | {"detail": "smoke run, read at its own sizes" + (f": {t['detail']}" if t["detail"] else "")}
        for t in targets
    ]


def evaluate_targets(rows: list[dict], decoding: list[dict], min_tokens: int = 16384) -> list[dict[str, Any]]:
    """The realistic targets: MFU of our best row (any mode) of a model at ``min_tokens`` or more;
    against HF Marian, at every batch size both measured, our best mode over Marian's best, the
    smallest ratio (the target holds at every batch); our beam-5 sentences/s over HF ``generate``'s."""
    ratios = []
    for tokens in sorted({x["max_tokens"] for x in rows if x["model"] == "base"}):
        ours = best(rows, "tok_s", model="base", system="ours", max_tokens=tokens)
        hf = best(rows, "tok_s", model="base", system="HF Marian", max_tokens=tokens)
        if ours and hf:
            ratio = ours["tok_s"] / hf["tok_s"]
            ratios.append((ratio, f"{tokens}: {ratio:.2f}x (ours {ours['mode']} / Marian {hf['mode']})"))
    speed = {(x["system"], x["strategy"]): x["sentences_per_s"] for x in decoding if "sentences_per_s" in x}
    ours_beam, hf_beam = speed.get(("ours", "beam5")), speed.get(("HF generate", "beam5"))
    beam = ours_beam / hf_beam if ours_beam and hf_beam else None
    return [
        mfu_target("base_mfu", best(rows, min_tokens=min_tokens, model="base", system="ours")),
        judged("base_vs_marian", min(ratios)[0] if ratios else None, "; ".join(d for _, d in ratios)),
        mfu_target("big_mfu", best(rows, min_tokens=min_tokens, model="big", system="ours")),
        judged("beam_vs_hf", beam, f"ours {ours_beam:.1f} vs HF {hf_beam:.1f} sentences/s" if beam else ""),
    ]


def section_realistic(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Training rows and decoding in priority order, each guarded, within the section's budget."""
    a, dev = ctx.args, ctx.device
    r = sec["results"]
    budget = Budget(a.realistic_budget_s, ctx.budget.skipped)  # its refusals listed with the check's
    data = load_data(ctx)
    train = data.splits["train"]
    lengths = {
        (arch, t): representative_batch(train.src_lengths, train.tgt_lengths, t, arch)
        for arch in {MODELS[m][2].replace("-", "_") for m in a.realistic_models}
        for t in a.realistic_tokens
    }
    peak, source = bf16_peak(ctx)
    systems = {"encoder-decoder": ["ours", *a.encdec_peers], "decoder-only": ["ours", *a.decoder_peers]}
    modes = [m for m in a.realistic_modes if dev.type == "cuda" or m != "cudagraphs"]
    lengths_from = f"{len(train)} training pairs of {'a slice of ' if a.quick else ''}Multi30k en-de"
    r.update(peak_bf16_tflops=peak / 1e12, peak_source=source, vocab=a.realistic_vocab, rows=[], decoding=[])
    r["summary"] = [
        f"bf16, vocabulary {a.realistic_vocab}, lengths from {lengths_from} (vocabulary {len(data.src_tokenizer)}); "
        f"{a.realistic_warmup} warm-up + {a.realistic_steps} measured steps (median); ours through "
        f"`Trainer.train_step` (CUDA graphs: model and loss in a hand-written step, as the peers); MFU against "
        f"{peak / 1e12:.4g} TFLOP/s ({source}), real tokens only."
    ]
    if len(modes) < len(a.realistic_modes):
        sec["notes"].append("cudagraphs rows not run: CUDA graphs need a CUDA device")
    report.write()
    for job in plan(a.realistic_models, a.realistic_tokens, modes, systems):
        if job[0] == "decode":
            decode_jobs(sec, ctx, report, data, budget)
            continue
        _, name, tokens, mode, system = job
        row: dict[str, Any] = {"model": name, "family": MODELS[name][2], "system": system, "mode": mode}
        row["max_tokens"] = tokens
        with guarded(row):
            what = f"{name} {system} {mode} {tokens}"
            budget.need(NEED_S[mode], what)
            ctx.budget.need(NEED_S[mode], what)
            row.update(measure(name, system, mode, tokens, ctx, lengths))
            row["mfu"] = row["train_flops"] / row["step_s"] / peak
            ours = best(r["rows"], "tok_s", model=name, system="ours", mode=mode, max_tokens=tokens)
            if system != "ours" and ours:  # on the peer's row, as decoding's: one ratio per peer
                row["ratio"] = ours["tok_s"] / row["tok_s"]
        r["rows"].append(row)
        report.write()
    ours = {x["strategy"]: x for x in r["decoding"] if x["system"] == "ours" and "sentences_per_s" in x}
    for x in r["decoding"]:
        if x["system"] != "ours" and x["strategy"] in ours and "sentences_per_s" in x:
            x["ratio"] = ours[x["strategy"]]["sentences_per_s"] / x["sentences_per_s"]
    if setup := r.get("decoding_setup"):
        r["summary"].append(
            f"Decoding: {setup['model']}, {setup['sentences']} sentences of {setup['split']} in batches of "
            f"{setup['batch']}, every output at most {setup['max_len']} tokens + EOS, {setup['precision']}."
        )
    r["trainer_rows"] = [x for x in ctx.trainer_rows if "tok_s" in x]  # Trainer.train_step on WMT-like batches
    # the targets' batch bound (16k tokens); a smoke run's tiny batches are read at its smallest batch
    r["targets"] = evaluate_targets(r["rows"], r["decoding"], min(a.realistic_tokens) if a.quick else 16384)
    if a.quick:
        r["targets"] = at_smoke_sizes(r["targets"])
    measured = [x for x in r["rows"] if x["system"] == "ours" and "tok_s" in x]
    if not measured and r["rows"] and all("skipped" in x for x in r["rows"]):
        raise OutOfTime(f"every row skipped for the time budget ({r['rows'][0]['skipped']})")
    check(sec, "our rows measured", bool(measured), f"{len(measured)} of ours measured")
    failed = [f"{x['model']} {x['system']} {x['mode']} {x['max_tokens']}" for x in r["rows"] if "error" in x]
    if failed:
        sec["notes"].append("rows that failed (their errors are in the table): " + "; ".join(failed))
