"""Decoding (greedy, beam, sampling), batched translation and loading of trained runs.

Typical use::

    model, tokenizers, cfg = load_run("outputs/exp/2026-01-01_00-00-00")  # or a checkpoint file
    hyps = translate_sentences(model, [tokenizers.src.encode(s) for s in lines], cfg.generation, "cpu")
    text = detokenize(hyps, tokenizers.tgt)

    loaded = load_models(["runs/a", "runs/b"])  # an ensemble (EnsembleModel) with the same interface

:func:`translate_file` (:mod:`.translate_file`) is the work of ``scripts/translate.py``: a text file
or stdin, line by line, into a file or stdout.
"""

from transformer.generation.beam import beam_search
from transformer.generation.common import Hypothesis, SearchLimits, decoding, length_penalty, max_lengths
from transformer.generation.ensemble import EnsembleModel, EnsembleState, load_models
from transformer.generation.loading import (
    LoadedRun,
    LoadError,
    Tokenizers,
    find_checkpoint,
    load_run,
    merge_generation,
    resolve_device,
)
from transformer.generation.overrides import TEST_TIME_FIELDS, test_time_overrides, test_time_refusal
from transformer.generation.prepare import PreparedDecoding, prepare_decoding
from transformer.generation.sampling import greedy_search, sample, top_k_top_p_filter
from transformer.generation.search import generate
from transformer.generation.translate import (
    batches_by_tokens,
    detokenize,
    make_src_tokens,
    translate_dataset,
    translate_sentences,
)
from transformer.generation.translate_file import LinesFailed, open_input, read_chunks, translate_file

__all__ = [
    "EnsembleModel",
    "EnsembleState",
    "Hypothesis",
    "LinesFailed",
    "LoadError",
    "SearchLimits",
    "TEST_TIME_FIELDS",
    "LoadedRun",
    "PreparedDecoding",
    "Tokenizers",
    "batches_by_tokens",
    "beam_search",
    "decoding",
    "detokenize",
    "find_checkpoint",
    "generate",
    "greedy_search",
    "length_penalty",
    "load_models",
    "load_run",
    "make_src_tokens",
    "merge_generation",
    "prepare_decoding",
    "resolve_device",
    "max_lengths",
    "open_input",
    "read_chunks",
    "sample",
    "test_time_overrides",
    "test_time_refusal",
    "top_k_top_p_filter",
    "translate_dataset",
    "translate_file",
    "translate_sentences",
]
