"""Decoding (greedy, beam, sampling), batched translation and loading of trained runs.

Typical use::

    model, tokenizers, cfg = load_run("runs/exp1")            # or a checkpoint path
    hyps = translate_sentences(model, src_ids, cfg.generation, "cpu", model.arch)
    text = detokenize(hyps, tokenizers.tgt)
"""

from transformer.generation.search import (
    Hypothesis,
    beam_search,
    decoding,
    generate,
    greedy_search,
    length_penalty,
    max_lengths,
    sample,
    top_k_top_p_filter,
)

__all__ = [
    "Hypothesis",
    "beam_search",
    "decoding",
    "generate",
    "greedy_search",
    "length_penalty",
    "max_lengths",
    "sample",
    "top_k_top_p_filter",
]
