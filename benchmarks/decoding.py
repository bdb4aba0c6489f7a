"""Decoding speed on the same weights, ours against Hugging Face ``generate`` and CTranslate2: the
library of ``decode_speed.py`` and of the GPU check's decoding rows (``gpu_check/realistic_decoding.py``);
no command line.

Ours is :func:`~transformer.generation.translate_sentences` (KV-cached greedy and beam search); HF
``generate`` runs on the copy of the weights in a ``MarianMTModel`` of the same dimensions
(:func:`~transformer.interop.hf_marian.to_marian`) with ``early_stopping="never"``, the exact stopping
rule our beam search uses, unless told otherwise, in the batches ours forms (sorted by length, at
most ``max_tokens`` source tokens x beam); CTranslate2 runs a saved folder and forms its batches
itself, of at most ``max_tokens / beam`` source tokens. Every system decodes with the same
:func:`search`; CTranslate2's outputs cut at the maximum get the EOS ours forces, so that every
system's token lists compare and count alike (:func:`timed`, :func:`same_share`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import synchronize
from transformer.analysis.markdown import cell, table
from transformer.config import GenerationConfig
from transformer.data.tokenizer import EOS_ID
from transformer.generation import translate_sentences
from transformer.generation.translate import batches_by_tokens, make_src_tokens

Decode = Callable[[list[list[int]], GenerationConfig], list[list[int]]]
"""One batch of source ids and the search -> one token list per sentence, ending with EOS."""
NAMES = {
    "ours": "ours (KV cache)",
    "hf": "HF generate (never)",
    "hf_early": "HF generate (early_stop)",
    "ct2": "CTranslate2 fp32",
    "ct2_int8": "CTranslate2 int8",
}
"""The table's names of ``decode_speed.py``'s systems."""


def search(strategy: str, beam: int, max_len: int, lenpen: float = 0.6, max_tokens: int = 10**9) -> GenerationConfig:
    """``greedy`` or ``beam`` search (of ``beam``) as every system can run it: a ``len ** lenpen``
    length penalty (the only form HF and CTranslate2 have), at most ``max_len`` tokens plus the
    forced EOS, at least one token, one hypothesis, batches of at most ``max_tokens`` source tokens x beam."""
    return GenerationConfig(
        strategy=strategy,
        beam_size=beam if strategy == "beam" else 1,
        length_penalty=lenpen,
        length_penalty_form="fairseq",
        max_len_a=0.0,
        max_len_b=max_len,
        min_len=1,
        nbest=1,
        max_tokens=max_tokens,
    )


def ours(model: torch.nn.Module, device: torch.device) -> Decode:
    """Our search on ``model``."""
    return lambda ids, gen: [h[0].tokens if h else [] for h in translate_sentences(model, ids, gen, device, model.arch)]


def hf_generate(model: torch.nn.Module, cfg: Any, device: torch.device, **overrides: Any) -> tuple[Decode, Any]:
    """HF ``generate`` on the Marian copy of ``model`` (an encoder-decoder, ``cfg`` its model config),
    ``overrides`` of ``generate``'s arguments (``early_stopping=True``); the decoder and the copy."""
    from transformer.interop.hf_marian import marian_generate, to_marian

    hf = to_marian(model.cpu(), cfg).to(device)

    def run(ids: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in ids]  # an empty source stays empty, as ours
        todo = [i for i, s in enumerate(ids) if s]
        for batch in batches_by_tokens([len(ids[i]) + 1 for i in todo], gen.max_tokens, gen.beam_size):
            idx = [todo[j] for j in batch]
            src = make_src_tokens([ids[i] for i in idx], "encoder_decoder", device=device)
            for i, row in zip(idx, marian_generate(hf, src, gen, **overrides)):
                out[i] = row
        return out

    return run, hf


def ctranslate2(
    folder: Path, tokenizers: Sequence[Any], device: torch.device, compute_type: str, arch: str, threads: int = 0
) -> tuple[Decode, Any]:
    """CTranslate2 on the model saved in ``folder`` with ``compute_type`` weights (``float32``,
    ``int8`` quantized on load, ...), ``threads`` intra-op threads (0: its default); the decoder and the engine."""
    from transformer.interop.ct2 import ct2_translate, load_ct2

    engine = load_ct2(folder, arch, device=device.type, compute_type=compute_type, threads=threads)

    def run(ids: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
        batch_tokens = max(1, gen.max_tokens // gen.beam_size)
        rows = ct2_translate(engine, ids, gen, *tokenizers, arch, max_batch_tokens=batch_tokens)
        return [r if not r or r[-1] == EOS_ID else r + [EOS_ID] for r in rows]  # the EOS ours forces at the maximum

    return run, engine


def timed(
    run: Decode, batches: list[list[list[int]]], gen: GenerationConfig, device: torch.device, warmup: list[list[int]]
) -> dict[str, Any]:
    """``run`` over ``batches``, after one call on ``warmup`` (kernels, first allocations), timed between
    synchronizations: seconds, sentences/s, generated tokens/s, the mean output length and the outputs."""
    with torch.inference_mode():
        run(warmup, gen)
        synchronize(device)
        start = time.perf_counter()
        outputs = [row for ids in batches for row in run(ids, gen)]
        synchronize(device)
        seconds = time.perf_counter() - start
    n, tokens = len(outputs), sum(map(len, outputs))
    return {
        "seconds": seconds,
        "sentences_per_s": n / seconds,
        "tokens_per_s": tokens / seconds,
        "mean_output_len": tokens / max(n, 1),
        "outputs": outputs,
    }


def same_share(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """The share of ``outputs`` that say what ``reference`` says (the tokens before EOS: an output cut at
    the maximum and a finished one compare by what they say)."""

    def body(t: list[int]) -> list[int]:
        return t[:-1] if t and t[-1] == EOS_ID else t

    return sum(body(a) == body(b) for a, b in zip(outputs, reference)) / max(len(outputs), 1)


def markdown(results: list[dict[str, Any]]) -> list[str]:
    """The table of ``decode_speed.py``'s results: per system and search its speed, ours over its
    speed, its peak memory, its BLEU (the same model must score the same) and its share of outputs equal to ours."""
    ours_speed = {r["strategy"]: r["sentences_per_s"] for r in results if r["system"] == "ours"}
    rows = [
        [
            NAMES.get(r["system"], r["system"]),
            "greedy" if r["beam"] == 1 else f"beam {r['beam']}",
            cell(r["sentences_per_s"], "{:.1f}"),
            cell(r["tokens_per_s"], "{:,.0f}"),
            cell(ours_speed[r["strategy"]] / r["sentences_per_s"] if r["strategy"] in ours_speed else None, "{:.2f}x"),
            cell(r["peak_mb"], "{:,.0f}"),
            cell(r["bleu"], "{:.2f}"),
            cell(r.get("same_as_ours") and 100 * r["same_as_ours"], "{:.1f}%"),
        ]
        for r in results
    ]
    header = ["system", "search", "sentences/s", "tokens/s", "ours / system", "peak MB", "BLEU", "= ours"]
    return table(header, "llrrrrrr", rows)
