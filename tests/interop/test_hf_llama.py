"""Decoder-only Llama-style models <-> Hugging Face LlamaForCausalLM (transformer.interop.hf_llama)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import tiny_model_config
from tests.generation.helpers import make_run_dir
from tests.interop.helpers import LLAMA, perturbed, random_sources
from transformer.config import GenerationConfig
from transformer.generation import load_run, translate_sentences
from transformer.interop import ExportError, export_run, import_hf_llama
from transformer.interop.hf_llama import from_hf_llama, hf_llama_state, llama_unsupported, to_hf_llama
from transformer.models import build_model

transformers = pytest.importorskip("transformers")

VARIANTS = {
    "gqa_swiglu_untied": {},
    "mha_geglu_tied_bias": {
        "attention.name": "mha",
        "attention.n_kv_heads": None,
        "ffn.name": "geglu",
        "bias": True,
        "tie_embeddings": "all",
        "norm.eps": 1e-6,
    },
    "mqa_scaled_untied": {
        "attention.name": "mqa",
        "attention.n_kv_heads": 1,
        "scale_embeddings": True,
        "ffn.glu_match_params": False,
    },
}


def _llama(variant: str, vocab: int = 60):
    cfg = tiny_model_config(**{**LLAMA, **VARIANTS[variant]})
    return perturbed(build_model(cfg, vocab)), cfg


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_against_hf_llama_logits(variant: str, tmp_path) -> None:
    model, cfg = _llama(variant)
    tokens = torch.randint(5, 60, (3, 11), generator=torch.Generator().manual_seed(1))
    hf = to_hf_llama(model, cfg)
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)
        hf.save_pretrained(tmp_path / "hf")
        reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(reloaded(input_ids=tokens).logits, ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_import_round_trip(variant: str, tmp_path) -> None:
    model, cfg = _llama(variant)
    to_hf_llama(model, cfg).save_pretrained(tmp_path / "hf")
    back, run_cfg = from_hf_llama(tmp_path / "hf")
    tokens = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), model(tokens), atol=1e-5, rtol=0)
    again = hf_llama_state(back, run_cfg.model)
    first = hf_llama_state(model, cfg)
    assert again.keys() == first.keys()
    for k in first:  # an embedding scale is folded in once, then the imported model has none
        torch.testing.assert_close(again[k], first[k], atol=0, rtol=0)
    assert run_cfg.model.arch == "decoder_only" and run_cfg.model.position.name == "rope"
    assert run_cfg.model.position.rope_theta == 500.0 and run_cfg.model.attention.n_kv_heads == cfg.attention.n_kv_heads


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    return make_run_dir(
        tmp_path_factory.mktemp("llama") / "run",
        arch="decoder_only",
        **{k: v for k, v in LLAMA.items() if k not in ("arch", "n_encoder_layers")},
    )


def test_export_folder_loads_and_generates_like_ours(llama_run, tmp_path) -> None:
    run_dir, model, tok, _ = llama_run
    out = export_run(run_dir, "hf", tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.model",
        "tokenizer_config.json",
        "transformer_zoo.yaml",
    } <= names
    assert (out / "tokenizer.model").read_bytes() == (run_dir / "spm.model").read_bytes()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)  # LlamaTokenizer over our SentencePiece model
    lines = ["A man is riding a bike.", "Two dogs play in the snow."]
    assert hf_tok(lines)["input_ids"] == [tok.encode(s) for s in lines]
    assert hf_tok.convert_tokens_to_ids("<sep>") == tok.sep_id and hf_tok.eos_token_id == tok.eos_id
    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    tokens = torch.tensor([tok.encode("A man is riding a bike.") + [tok.sep_id] + tok.encode("Ein Mann")])
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, model(tokens), atol=1e-4, rtol=0)
    # greedy decoding with HF generate (one sentence at a time: no padding) equals ours
    gen = GenerationConfig(strategy="greedy", max_len_a=0.0, max_len_b=12)
    for src in random_sources(4, len(tok), seed=3):
        ours = translate_sentences(model, [src], gen, "cpu")[0][0].tokens
        with torch.inference_mode():
            out_ids = hf.generate(
                input_ids=torch.tensor([src + [tok.sep_id]]),
                max_new_tokens=13,
                do_sample=False,
                num_beams=1,
                eos_token_id=tok.eos_id,
                pad_token_id=tok.pad_id,
                bad_words_ids=[[tok.pad_id]],
                forced_eos_token_id=tok.eos_id,
            )
        assert out_ids[0, len(src) + 1 :].tolist() == ours


def test_import_folder_as_run(llama_run, tmp_path) -> None:
    run_dir, model, tok, _ = llama_run
    hf_dir = export_run(run_dir, "hf", tmp_path / "hf")
    back = import_hf_llama(hf_dir, tmp_path / "imported")
    loaded = load_run(back)
    assert loaded.cfg.generation.max_len_b == 5  # the run's settings travel in transformer_zoo.yaml
    ids = [tok.encode(s) for s in ("A dog runs.", "Two women talk on a bench.")]
    gen = GenerationConfig(strategy="beam", beam_size=3, max_len_b=6)
    assert translate_sentences(loaded.model, ids, gen, "cpu") == translate_sentences(model, ids, gen, "cpu")
    with pytest.raises(ExportError, match="already exists"):
        import_hf_llama(hf_dir, tmp_path / "imported")


@pytest.mark.parametrize(
    "override,switch",
    [
        ({"norm_position": "post"}, "model.norm_position=post"),
        ({"norm.name": "layernorm"}, "model/norm=layernorm"),
        ({"ffn.name": "relu"}, "model/ffn=relu"),
        ({"position.name": "alibi"}, "model/position=alibi"),
        ({"scale_embeddings": True, "tie_embeddings": "all"}, "model.scale_embeddings=true"),
        ({"arch": "encoder_decoder", "n_encoder_layers": 2}, "model.arch=encoder_decoder"),
    ],
)
def test_refuses_what_llama_cannot_represent(override: dict, switch: str) -> None:
    cfg = tiny_model_config(**{**LLAMA, **override})
    assert any(switch in why for why in llama_unsupported(cfg))
    with pytest.raises(ExportError, match=switch.replace(".", r"\.")):
        to_hf_llama(build_model(cfg, 40), cfg)


def test_import_refuses_rope_scaling_it_lacks(tmp_path) -> None:
    """linear/dynamic/yarn/llama3 import (tests/interop/test_hf_qwen3.py); longrope does not."""
    model, cfg = _llama("gqa_swiglu_untied")
    hf = to_hf_llama(model, cfg)
    hf.config.rope_parameters = {
        "rope_type": "longrope",
        "factor": 2.0,
        "rope_theta": 500.0,
        "long_factor": [1.0] * 4,
        "short_factor": [1.0] * 4,
        "original_max_position_embeddings": 64,
    }
    hf.save_pretrained(tmp_path / "hf")
    with pytest.raises(ExportError, match="rope_type='longrope'"):
        from_hf_llama(tmp_path / "hf")


def test_import_refuses_yarn_mscale_with_mscale_all_dim(tmp_path) -> None:
    """With both set, HF's YaRN takes their ratio as its attention factor (1.0 here), where ours would
    be 0.1 ln(factor) + 1: such a folder is refused, not imported with other logits."""
    model, cfg = _llama("gqa_swiglu_untied")
    hf = to_hf_llama(model, cfg)
    hf.config.rope_parameters = {
        "rope_type": "yarn",
        "factor": 4.0,
        "rope_theta": 500.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 8,
    }
    assert transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"](hf.config, "cpu")[1] == 1.0
    hf.save_pretrained(tmp_path / "hf")
    with pytest.raises(ExportError, match="rope_parameters mscale with mscale_all_dim"):
        from_hf_llama(tmp_path / "hf")


def test_hf_exporters_share_one_check_of_unmatched_weights(monkeypatch) -> None:
    """hf_llama and hf_moe build their HF model through hf_decoder.hf_model_holding, which names
    what a mapping left unmatched on either side."""
    from transformer.interop import hf_decoder, hf_moe

    model, cfg = _llama("gqa_swiglu_untied")
    state = hf_llama_state(model, cfg)
    del state["model.norm.weight"]
    state["model.bogus.weight"] = torch.zeros(1)
    monkeypatch.setattr("transformer.interop.hf_llama.hf_llama_state", lambda *_: state)
    with pytest.raises(
        ExportError, match=r"the Llama mapping left weights unmatched: missing \['model.norm.weight'\], "
    ):
        to_hf_llama(model, cfg)
    assert hf_moe.hf_model_holding is hf_decoder.hf_model_holding


def test_hf_importers_share_the_model_fields_and_the_weights_check(tmp_path) -> None:
    """from_hf_llama and from_hf_moe read the fields every decoder shares and load the weights through
    hf_decoder (imported_fields, imported_model), which names what does not fit."""
    from types import SimpleNamespace

    from transformer.interop import hf_decoder, hf_llama, hf_moe_import

    for name in ("imported_fields", "imported_model"):
        assert getattr(hf_llama, name) is getattr(hf_moe_import, name) is getattr(hf_decoder, name)
    model, cfg = _llama("gqa_swiglu_untied")
    hc = SimpleNamespace(eos_token_id=[3, 7], pad_token_id=None, vocab_size=60)
    state = dict(model.state_dict())
    loaded = hf_decoder.imported_model(hc, cfg, state, tmp_path, "LlamaForCausalLM")
    assert (loaded.eos_id, loaded.pad_id, loaded.training) == (3, 0, False)
    torch.testing.assert_close(loaded.state_dict(), model.state_dict())
    state["bogus.weight"] = state.pop("decoder.final_norm.weight")
    with pytest.raises(
        ExportError, match=r"weights do not fit LlamaForCausalLM's layout: missing \['decoder.final_norm"
    ):
        hf_decoder.imported_model(hc, cfg, state, tmp_path, "LlamaForCausalLM")
    del state["bogus.weight"]  # a weight the folder may lack: it keeps its initial value
    hf_decoder.imported_model(hc, cfg, state, tmp_path, "LlamaForCausalLM", optional=("final_norm.weight",))
