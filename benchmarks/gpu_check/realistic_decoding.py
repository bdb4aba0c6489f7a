"""Decoding in the ``realistic`` section of the GPU check: greedy and beam 5 with ``transformer_2017_base``
(random, seeded weights: a search's speed depends on its steps, not on what was learned), ours beside
the same weights in HF ``generate`` and CTranslate2 (:mod:`benchmarks.decoding`). Every output runs to
the split's mean target length plus EOS, so every system does the same work; bf16 on a GPU, fp32 on a CPU."""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any

import torch

from benchmarks import decoding, one_line, release, reset_peak
from transformer.models import build_model

from .presets import model_config
from .report import Budget, Report, guarded

JOBS = (
    ("ours", "beam5"),
    ("HF generate", "beam5"),
    ("ours", "greedy"),
    ("HF generate", "greedy"),
    ("CTranslate2", "beam5"),
    ("CTranslate2", "greedy"),
)
NEED_S = 30  # seconds a decoding row needs on a GPU (HF beam search is the slowest)


def _setup(ctx: Any, data: Any) -> dict[str, Any]:
    """The model (random weights, seeded), sources sorted by length and cut into batches, the search."""
    a = ctx.args
    # two vocabularies cannot share one embedding table: the target's is then tied to the output layer only
    cfg, _, over = model_config("base", a.quick, [] if data.joint_vocab else ["model.tie_embeddings=decoder"])
    torch.manual_seed(0)
    model = build_model(cfg, len(data.src_tokenizer), None if data.joint_vocab else len(data.tgt_tokenizer)).eval()
    split = data.splits.get("test_2016_flickr") or data.splits["test"]
    n = min(a.realistic_sentences, len(split))
    src = sorted((list(split.src[i]) for i in range(n)), key=len)
    return {
        "cfg": cfg,
        "overrides": over,
        "model": model,
        "chunks": [src[j : j + a.decode_batch] for j in range(0, n, a.decode_batch)],
        "sentences": n,
        "max_len": int(round(float(split.tgt_lengths[:n].mean()))),
        "split": split.name,
    }


def decode_row(system: str, strategy: str, setup: dict[str, Any], ctx: Any, data: Any) -> dict[str, Any]:
    """One (system, search): time, speed, output lengths, peak memory; raises what the row raised."""
    dev, model = ctx.device, setup["model"]
    gen = decoding.search("beam" if strategy == "beam5" else "greedy", 5, setup["max_len"])
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()
    hold = None
    try:
        reset_peak(dev)
        if system == "ours":
            run = decoding.ours(model.to(dev), dev)
        elif system == "HF generate":
            run, hold = decoding.hf_generate(model, setup["cfg"], dev)
        elif importlib.util.find_spec("ctranslate2") is None:
            raise RuntimeError("ctranslate2 is not installed (pip install -e '.[dev]')")
        else:
            from transformer.interop.ct2 import save_ct2

            tokenizers = (data.src_tokenizer, data.tgt_tokenizer)
            save_ct2(model.cpu(), setup["cfg"], tokenizers, ctx.work / "realistic_ct2")
            compute = "bfloat16" if dev.type == "cuda" else "float32"
            run, hold = decoding.ctranslate2(ctx.work / "realistic_ct2", tokenizers, dev, compute, "encoder_decoder")
        with amp:  # warm-up on 8 sentences: kernels, CTranslate2's first allocation
            row = decoding.timed(run, setup["chunks"], gen, dev, warmup=setup["chunks"][0][:8])
        if dev.type == "cuda":
            row["peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
        return row
    finally:
        del hold
        model.cpu()
        release(dev)


def decode_jobs(sec: dict[str, Any], ctx: Any, report: Report, data: Any, budget: Budget) -> None:
    """Every (system, search) of :data:`JOBS` into ``sec["results"]["decoding"]``, guarded and budgeted."""
    rows = sec["results"]["decoding"]
    try:
        setup = _setup(ctx, data)
    except Exception as err:  # no test split, a model that cannot be built: recorded, the section goes on
        rows.append({"system": "all", "strategy": "-", "error": one_line(err)})
        report.write()
        return
    sec["results"]["decoding_setup"] = {
        "model": "transformer_2017_base (random weights, seed 0)",
        "overrides": setup["overrides"],
        "split": setup["split"],
        "sentences": setup["sentences"],
        "batch": ctx.args.decode_batch,
        "max_len": setup["max_len"],
        "precision": "bf16" if ctx.device.type == "cuda" else "fp32",
    }
    ours: dict[str, list[list[int]]] = {}
    for system, strategy in JOBS:
        row: dict[str, Any] = {"system": system, "strategy": strategy}
        with guarded(row):
            need = 3 if ctx.args.quick else NEED_S
            budget.need(need, f"decoding {system} {strategy}")
            ctx.budget.need(need, f"decoding {system} {strategy}")
            row.update(decode_row(system, strategy, setup, ctx, data))
            outputs = row.pop("outputs")
            if system == "ours":
                ours[strategy] = outputs
            elif strategy in ours:
                row["equal_to_ours"] = decoding.same_share(outputs, ours[strategy])
        rows.append(row)
        report.write()
