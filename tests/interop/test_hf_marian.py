"""2017 encoder-decoders -> Hugging Face MarianMTModel (transformer.interop.hf_marian)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model_config
from tests.generation.helpers import make_run_dir
from tests.interop.helpers import perturbed, random_sources, reversal_model
from transformer.config import GenerationConfig
from transformer.generation import translate_sentences
from transformer.generation.translate import make_src_tokens
from transformer.interop import ExportError, export_run
from transformer.interop.hf_marian import marian_generate, marian_permutation, marian_unsupported, to_marian
from transformer.models import build_model
from transformer.modules.positions import sinusoidal_table

transformers = pytest.importorskip("transformers")

VARIANTS = {  # (overrides, joint vocabulary)
    "2017_shared": ({}, True),
    "decoder_tied_separate_vocab_gelu_nobias": (
        {"tie_embeddings": "decoder", "ffn.name": "gelu", "bias": False},
        False,
    ),
    "untied_unscaled": ({"tie_embeddings": "none", "scale_embeddings": False}, True),
}


def _batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(5, 50, (3, 9), generator=g)
    src[:, -1] = 3
    src[1, 5], src[1, 6:] = 3, 0  # a padded row
    prev = torch.randint(5, 50, (3, 7), generator=g)
    prev[:, 0] = 2
    return src, prev


def test_permutation_maps_our_sinusoids_to_marians() -> None:
    ours = sinusoidal_table(20, 16)
    marian = transformers.MarianMTModel(
        transformers.MarianConfig(
            d_model=16,
            max_position_embeddings=20,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            vocab_size=10,
            pad_token_id=0,
            decoder_start_token_id=0,
        )
    ).model.encoder.embed_positions.weight
    torch.testing.assert_close(ours[:, marian_permutation(16)], marian.detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_against_hf_marian_logits(variant: str, tmp_path) -> None:
    overrides, joint = VARIANTS[variant]
    cfg = tiny_model_config(**overrides)
    model = perturbed(build_model(cfg, 60, None if joint else 50))
    src, prev = _batch()
    hf = to_marian(model, cfg)
    with torch.no_grad():
        ours = model(src, prev)
        got = hf(input_ids=src, attention_mask=src.ne(0), decoder_input_ids=prev).logits
        torch.testing.assert_close(got, ours, atol=1e-4, rtol=0)
        hf.save_pretrained(tmp_path / "hf")  # Marian recomputes its sinusoids on load: the permutation must hold
        reloaded = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
        got = reloaded(input_ids=src, attention_mask=src.ne(0), decoder_input_ids=prev).logits
        torch.testing.assert_close(got, ours, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def reversal():
    return reversal_model()


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_hf_generate_equals_ours(reversal, strategy: str) -> None:
    model, cfg = reversal
    hf = to_marian(model, cfg)
    ids = random_sources(12, 40, seed=5, hi=12)
    gen = GenerationConfig(
        strategy=strategy, beam_size=5, length_penalty=0.6, length_penalty_form="fairseq", max_len_a=0.0, max_len_b=30
    )
    ours = [h[0].tokens for h in translate_sentences(model, ids, gen, "cpu", "encoder_decoder")]
    assert all(len(t) < 31 for t in ours)  # ended by the model, not by the length limit
    assert marian_generate(hf, make_src_tokens(ids, "encoder_decoder"), gen) == ours


@pytest.fixture(scope="module")
def marian_run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("marian") / "run", joint=False)


def test_export_folder_with_tokenizer(marian_run, tmp_path) -> None:
    run_dir, model, src_tok, tgt_tok = marian_run
    out = export_run(run_dir, "hf", tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "source.spm",
        "target.spm",
        "vocab.json",
        "target_vocab.json",
        "tokenizer_config.json",
    } <= names
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    hf_tok = transformers.MarianTokenizer.from_pretrained(out)
    lines = ["A man is riding a bike.", "Two dogs play in the snow."]
    assert hf_tok(lines)["input_ids"] == [src_tok.encode(s) + [src_tok.eos_id] for s in lines]
    batch = hf_tok(lines, return_tensors="pt", padding=True)
    gen = GenerationConfig(strategy="greedy", max_len_a=0.0, max_len_b=8)
    ours = translate_sentences(model, [src_tok.encode(s) for s in lines], gen, "cpu")
    with torch.inference_mode():
        out_ids = hf.generate(**batch, max_new_tokens=9, num_beams=1, do_sample=False)
    texts = hf_tok.batch_decode(out_ids, skip_special_tokens=True)
    assert texts == [tgt_tok.decode(h[0].tokens) for h in ours]


@pytest.mark.parametrize(
    "override,switch",
    [
        ({"norm_position": "pre"}, "model.norm_position=pre"),
        ({"norm.name": "rmsnorm"}, "model/norm=rmsnorm"),
        ({"norm.eps": 1e-6}, "model.norm.eps=1e-06"),
        ({"ffn.name": "swiglu"}, "model/ffn=swiglu"),
        ({"position.name": "rope"}, "model/position=rope"),
        ({"position.name": "learned"}, "model/position=learned"),
        ({"attention.name": "gqa", "attention.n_kv_heads": 2}, "model/attention=gqa"),
        ({"arch": "decoder_only"}, "model.arch=decoder_only"),
    ],
)
def test_refuses_what_marian_cannot_represent(override: dict, switch: str) -> None:
    cfg = tiny_model_config(**override)
    assert any(switch in why for why in marian_unsupported(cfg))
    if cfg.arch == "encoder_decoder":
        with pytest.raises(ExportError, match=switch.replace(".", r"\.")):
            to_marian(build_model(cfg, 40), cfg)
