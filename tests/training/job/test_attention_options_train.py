"""The attention options train and decode end to end on a slice of real Multi30k (tiny
models, 2 updates), as scripts/train.py runs them, and the run folder loads for translation."""

from __future__ import annotations

import pytest

from tests.training.conftest import small_config
from transformer.config import GenerationConfig
from transformer.generation import load_run, translate_sentences
from transformer.training.job.run import train

TINY = ("model.d_model=32", "model.d_ff=64", "train.max_updates=2", "train.validate_every=2")
OPTIONS = {
    "qwen3_style_tiny": ("model=qwen3_style_tiny", "model.n_decoder_layers=2"),
    "mla_decoder_only": (
        "model=llama_style_tiny",
        "model.n_decoder_layers=2",
        "model/attention=mla",
        "model.attention.q_lora_rank=16",
    ),
    "window_pattern_decoder_only": (
        "model=llama_style_tiny",
        "model.n_decoder_layers=2",
        "model.attention_window=4",
        "model.attention_window_pattern=2",
        "model.position.rope_scaling.rope_type=yarn",
        "model.position.rope_scaling.factor=2",
        "model.position.rope_scaling.original_max_position_embeddings=32",
    ),
    "mla_window_encoder_decoder": (
        "model=transformer_tiny",
        "model.n_encoder_layers=2",
        "model.n_decoder_layers=2",
        "model/position=rope",
        "model/attention=mla",
        "model.attention_window=4",
        "model.qk_norm=none",
    ),
    "qk_norm_encoder_decoder": (
        "model=transformer_tiny",
        "model.n_encoder_layers=2",
        "model.n_decoder_layers=2",
        "model.qk_norm=layernorm",
        "model.attention_window=4",
    ),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_attention_option_trains_and_translates(small_corpus, tmp_path, option):
    cfg = small_config(small_corpus, tmp_path / "run", *OPTIONS[option], *TINY)
    results = train(cfg)
    assert results["updates"] == 2 and results["bleu"] is not None
    loaded = load_run(tmp_path / "run")
    ids = [loaded.tokenizers.src.encode("A dog runs in the snow.")]
    gen = GenerationConfig(strategy="beam", beam_size=2, max_len_a=0.0, max_len_b=6)
    beams = translate_sentences(loaded.model, ids, gen, "cpu")
    greedy = translate_sentences(
        loaded.model, ids, GenerationConfig(strategy="greedy", max_len_a=0.0, max_len_b=6), "cpu"
    )
    for hyps in (beams, greedy):
        tokens = hyps[0][0].tokens
        assert len(hyps) == 1 and 0 < len(tokens) <= 7 and all(0 <= t < len(loaded.tokenizers.tgt) for t in tokens)
