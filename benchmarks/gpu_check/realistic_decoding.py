"""Decoding in the ``realistic`` section of the GPU check: greedy and beam 5 with ``transformer_2017_base``
(random, seeded weights: a search's speed depends on its steps, not on what was learned), ours
(:func:`~transformer.generation.translate_sentences`) beside the same weights in HF ``generate``
(:func:`~transformer.interop.hf_marian.to_marian`) and CTranslate2 (:func:`~transformer.interop.ct2.save_ct2`).
Every output runs to the split's mean target length plus EOS, so every system does the same work;
bf16 on a GPU, fp32 on a CPU."""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import one_line, release, reset_peak, synchronize
from transformer.config import GenerationConfig
from transformer.generation import translate_sentences
from transformer.generation.translate import make_src_tokens
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
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
    # two vocabularies cannot share one embedding table: the target's is then tied to the output layer only
    cfg, _, over = model_config("base", a.quick, [] if data.joint_vocab else ["model.tie_embeddings=decoder"])
    torch.manual_seed(0)
    model = build_model(cfg, len(src_tok), None if data.joint_vocab else len(tgt_tok)).eval()
    split = data.splits.get("test_2016_flickr") or data.splits["test"]
    n = min(a.realistic_sentences, len(split))
    src = [list(split.src[i]) for i in range(n)]
    order = sorted(range(n), key=lambda i: len(src[i]))
    chunks = [[src[i] for i in order[j : j + a.decode_batch]] for j in range(0, n, a.decode_batch)]
    max_len = int(round(float(split.tgt_lengths[:n].mean())))
    return {
        "cfg": cfg,
        "overrides": over,
        "model": model,
        "tokenizers": (src_tok, tgt_tok),
        "chunks": chunks,
        "sentences": n,
        "max_len": max_len,
        "split": split.name,
    }


def _search(strategy: str, max_len: int) -> GenerationConfig:
    return GenerationConfig(
        strategy="beam" if strategy == "beam5" else "greedy",
        beam_size=5 if strategy == "beam5" else 1,
        length_penalty=0.6,
        length_penalty_form="fairseq",
        max_len_a=0.0,
        max_len_b=max_len,
        min_len=1,
        nbest=1,
        max_tokens=10**9,
    )


def _decoder(system: str, setup: dict[str, Any], device: torch.device, work: Any) -> tuple[Callable, Any]:
    """``(decode one batch of source ids -> token lists, what to free)`` for ``system``."""
    model, cfg = setup["model"], setup["cfg"]
    if system == "ours":
        m = model.to(device)
        return (lambda ids, gen: [h[0].tokens if h else [] for h in translate_sentences(m, ids, gen, device)]), None
    if system == "HF generate":
        from transformer.interop.hf_marian import marian_generate, to_marian

        hf = to_marian(model.cpu(), cfg).to(device)
        return (lambda ids, gen: marian_generate(hf, make_src_tokens(ids, "encoder_decoder", device=device), gen)), hf
    if importlib.util.find_spec("ctranslate2") is None:
        raise RuntimeError("ctranslate2 is not installed (pip install -e '.[dev]')")
    from transformer.interop.ct2 import ct2_translate, load_ct2, save_ct2

    folder = work / "realistic_ct2"
    save_ct2(model.cpu(), cfg, setup["tokenizers"], folder)
    compute = "bfloat16" if device.type == "cuda" else "float32"
    engine = load_ct2(folder, "encoder_decoder", device=device.type, compute_type=compute)
    src_tok, tgt_tok = setup["tokenizers"]
    eos = tgt_tok.eos_id

    def run(ids: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
        rows = ct2_translate(engine, ids, gen, src_tok, tgt_tok, "encoder_decoder", max_batch_tokens=10**9)
        return [r if not r or r[-1] == eos else r + [eos] for r in rows]  # the EOS ours forces at the maximum

    return run, engine


def decode_row(system: str, strategy: str, setup: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """One (system, search): time, speed, output lengths, peak memory; raises what the row raised."""
    dev = ctx.device
    gen = _search(strategy, setup["max_len"])
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()
    hold = None
    try:
        reset_peak(dev)
        run, hold = _decoder(system, setup, dev, ctx.work)
        with torch.inference_mode(), amp:
            run(setup["chunks"][0][:8], gen)  # warm-up (kernels, CTranslate2's first allocation)
            synchronize(dev)
            t = time.perf_counter()
            outputs = [row for ids in setup["chunks"] for row in run(ids, gen)]
            synchronize(dev)
            seconds = time.perf_counter() - t
        n = setup["sentences"]
        row = {
            "seconds": seconds,
            "sentences_per_s": n / seconds,
            "tokens_per_s": sum(map(len, outputs)) / seconds,
            "mean_output_len": sum(map(len, outputs)) / n,
            "outputs": outputs,
        }
        if dev.type == "cuda":
            row["peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
        return row
    finally:
        del hold
        setup["model"].cpu()
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
            row.update(decode_row(system, strategy, setup, ctx))
            outputs = row.pop("outputs")
            if system == "ours":
                ours[strategy] = outputs
            elif strategy in ours:
                same = sum(_body(a) == _body(b) for a, b in zip(outputs, ours[strategy]))
                row["equal_to_ours"] = same / max(len(outputs), 1)
        rows.append(row)
        report.write()


def _body(tokens: list[int]) -> list[int]:
    """The tokens before EOS (a cut output and a finished one compare by what they say)."""
    return tokens[:-1] if tokens and tokens[-1] == 3 else tokens
