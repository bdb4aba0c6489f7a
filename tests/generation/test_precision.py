"""The precision decoding runs in: the run's on an accelerator (autocast), fp32 on the CPU.

No GPU here: the accelerator is the CPU with :data:`~transformer.precision.FP32_DEVICES`
emptied, so that ``torch.autocast("cpu", ...)`` stands in for CUDA's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.generation.helpers import compose_script_config, make_model, make_run_dir
from tests.generation.test_translate import random_ids
from transformer import precision as precision_module
from transformer.config import ConfigError, GenerationConfig
from transformer.generation import prepare_decoding, translate_sentences
from transformer.precision import decoding_precision
from transformer.training.loop.validation import translate_and_score

GEN = GenerationConfig(strategy="beam", beam_size=3, max_len_a=1.0, max_len_b=6)


@pytest.fixture
def accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU decodes as an accelerator does."""
    monkeypatch.setattr(precision_module, "FP32_DEVICES", ())


def _linear_dtypes(model: nn.Module) -> tuple[set[torch.dtype], list]:
    """The dtypes of every Linear's output while the hooks stay (remove them with the handles)."""
    seen: set[torch.dtype] = set()
    handles = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for m in model.modules()
        if isinstance(m, nn.Linear)
    ]
    return seen, handles


def test_decoding_precision_is_the_runs_on_an_accelerator_and_fp32_on_the_cpu() -> None:
    for precision in ("auto", "fp32", "bf16", "fp16"):
        assert decoding_precision(precision, "cpu") == "fp32"
    assert decoding_precision("bf16", "cuda") == "bf16" and decoding_precision("fp16", "cuda:1") == "fp16"
    assert decoding_precision("fp32", "cuda") == "fp32"
    if not torch.cuda.is_available():
        assert decoding_precision("auto", "cuda") == "fp32"  # no device to have fast bf16
    with pytest.raises(ValueError, match="precision='fp8' is not one of auto, fp32, bf16, fp16"):
        decoding_precision("fp8", "cpu")


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_on_an_accelerator_the_decoder_runs_in_the_runs_precision(arch: str, accelerator: None) -> None:
    model = make_model(arch, 40, eos_bias=2.0)
    seen, handles = _linear_dtypes(model)
    try:
        hyps = translate_sentences(model, random_ids(4), GEN, "cpu", precision="bf16")
    finally:
        for h in handles:
            h.remove()
    assert seen == {torch.bfloat16}
    assert all(hs and isinstance(hs[0].logprob, float) and hs[0].logprob > float("-inf") for hs in hyps)


def test_on_the_cpu_the_runs_precision_changes_nothing() -> None:
    model = make_model("encoder_decoder", 40, eos_bias=2.0)
    seen, handles = _linear_dtypes(model)
    try:
        bf16 = translate_sentences(model, random_ids(4), GEN, "cpu", precision="bf16")
    finally:
        for h in handles:
            h.remove()
    fp32 = translate_sentences(model, random_ids(4), GEN, "cpu")
    assert seen == {torch.float32}
    assert [[(h.tokens, h.score, h.logprob) for h in hs] for hs in bf16] == [
        [(h.tokens, h.score, h.logprob) for h in hs] for hs in fp32
    ]


def test_validation_bleu_decodes_in_the_precision_it_is_given(accelerator: None) -> None:
    class Split:
        src = random_ids(3)
        tgt_text = ["a", "b", "c"]

    class Tok:
        def decode(self, ids: list[int]) -> str:
            return " ".join(map(str, ids))

    model = make_model("encoder_decoder", 40, eos_bias=2.0)
    seen, handles = _linear_dtypes(model)
    try:
        kwargs = dict(split="valid", tokenize="13a", lowercase=False, progress=False, log=print)
        translate_and_score(model, Split(), Tok(), GEN, torch.device("cpu"), precision="fp16", **kwargs)
    finally:
        for h in handles:
            h.remove()
    assert seen == {torch.float16}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    return make_run_dir(tmp_path_factory.mktemp("precision") / "run")


def test_the_scripts_decode_in_the_runs_precision_or_their_own(run, accelerator: None) -> None:
    """``precision`` of translate.yaml / evaluate.yaml: null takes the run's ``train.precision``
    (``auto``: fp32 on a device without fast bf16); an unknown one is a one-line config error."""

    def prepared(*overrides: str) -> str:
        return prepare_decoding(compose_script_config("translate", [f"checkpoint={run[0]}", *overrides])).precision

    assert prepared() == "fp32"  # the run's auto, on a device that is not CUDA
    assert prepared("precision=bf16") == "bf16"
    with pytest.raises(ConfigError, match="precision='half' is not one of"):
        prepared("precision=half")
