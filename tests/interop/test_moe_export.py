"""``model/ffn=moe`` models are refused by name, before anything is written, by every export target
but Hugging Face's MoE classes (decoder-only: MixtralForCausalLM, tests/interop/test_hf_mixtral.py)."""

import pytest

from tests.conftest import tiny_model_config
from transformer.interop import unsupported
from transformer.interop.hf_llama import llama_unsupported
from transformer.interop.hf_moe import MIXTRAL_TARGET

LLAMA_LIKE = dict(
    norm_position="pre",
    norm__name="rmsnorm",
    position__name="rope",
    bias=False,
    tie_embeddings="none",
    scale_embeddings=False,
    ffn__name="moe",
)


@pytest.mark.parametrize(
    "arch,fmt,reason",
    [
        ("encoder_decoder", "hf", "model/ffn=moe: Marian's feed-forward block has two matrices"),
        (
            "encoder_decoder",
            "ctranslate2",
            "model/ffn=moe: CTranslate2's Transformer specs have no mixture-of-experts layer",
        ),
        (
            "decoder_only",
            "ctranslate2",
            "model/ffn=moe: CTranslate2's Transformer specs have no mixture-of-experts layer",
        ),
    ],
)
def test_moe_is_refused_with_a_sentence_naming_the_switch(arch, fmt, reason):
    _, why = unsupported(tiny_model_config(arch=arch, **LLAMA_LIKE), fmt)
    assert any(w.startswith(reason) for w in why), why
    dense_ffn = "relu" if (arch, fmt) == ("encoder_decoder", "hf") else "swiglu"  # Marian: two matrices
    _, dense = unsupported(tiny_model_config(arch=arch, **{**LLAMA_LIKE, "ffn__name": dense_ffn}), fmt)
    assert not any(w.startswith("model/ffn") for w in dense)


def test_decoder_only_moe_exports_as_mixtral_and_llama_still_refuses_it():
    cfg = tiny_model_config(arch="decoder_only", **LLAMA_LIKE)
    assert unsupported(cfg, "hf") == (MIXTRAL_TARGET, [])
    assert any(w.startswith("model/ffn=moe: Llama's MLP is gated") for w in llama_unsupported(cfg))
