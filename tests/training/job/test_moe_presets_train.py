"""The mixtral_style_tiny and deepseek_style_tiny presets end to end on a slice of real Multi30k (narrowed
to width 32, 2 layers, 2 updates): ``train()`` (what scripts/train.py runs), scripts/translate.py on
the run folder, and scripts/export.py to their Hugging Face class and back (the trained weights,
DeepSeek's moved selection bias included, give HF's logits and the same translations)."""

from __future__ import annotations

import pytest
import torch

from tests.generation.helpers import compose_script_config, load_script
from tests.training.conftest import small_config
from transformer.generation import load_run
from transformer.training.job.run import train

transformers = pytest.importorskip("transformers")

TINY = (
    "model.n_encoder_layers=0",
    "model.n_decoder_layers=2",
    "model.d_model=32",
    "model.d_ff=64",
    "train.max_updates=2",
    "train.validate_every=2",
)
PRESETS = {
    "mixtral_style_tiny": ("model=mixtral_style_tiny", "model.attention_window=8"),
    "deepseek_style_tiny": (
        "model=deepseek_style_tiny",
        "model.attention.kv_lora_rank=16",
        "model.attention.q_lora_rank=24",
        "model.ffn.expert_d_ff=32",
    ),
}
SENTENCES = ["A dog runs in the snow.", "Two young men in red shirts are playing soccer on a green field near a river."]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_trains_translates_and_exports(small_corpus, tmp_path, preset):
    cfg = small_config(small_corpus, tmp_path / "run", *PRESETS[preset], *TINY)
    results = train(cfg)
    assert results["updates"] == 2 and results["bleu"] is not None
    assert results["active_params"] < results["params"]  # 2 of 8 experts per token
    (tmp_path / "in.en").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    translate = load_script("translate")
    assert (
        translate.run(
            compose_script_config(
                "translate",
                [
                    f"checkpoint={tmp_path / 'run'}",
                    f"input={tmp_path / 'in.en'}",
                    f"output={tmp_path / 'out.de'}",
                    "generation.beam_size=2",
                    "generation.max_len_a=0",
                    "generation.max_len_b=6",
                    "progress=false",
                ],
            )
        )
        == 2
    )
    hyps = (tmp_path / "out.de").read_text(encoding="utf-8").split("\n")
    assert len(hyps) == 3 and hyps[2] == "", hyps

    loaded = load_run(tmp_path / "run")
    export = load_script("export")
    hf_dir = export.run(
        compose_script_config("export", [f"run={tmp_path / 'run'}", "format=hf", f"out={tmp_path / 'hf'}"])
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert type(hf).__name__ == ("MixtralForCausalLM" if preset.startswith("mixtral") else "DeepseekV3ForCausalLM")
    tok = loaded.tokenizers.src
    tokens = torch.tensor([tok.encode(SENTENCES[1]) + [tok.sep_id] + tok.encode("Zwei junge Männer spielen Fußball.")])
    if preset.startswith("mixtral"):
        assert tokens.shape[1] > 8  # past the window
    else:  # the aux-loss-free balance moved the selection bias during the 2 updates, and it was exported
        assert any(layer.mlp.gate.e_score_correction_bias.abs().max() > 0 for layer in hf.model.layers)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, loaded.model(tokens), atol=1e-4, rtol=0)
    back = export.run(compose_script_config("export", [f"run={hf_dir}", "format=zoo", f"out={tmp_path / 'back'}"]))
    assert (
        translate.run(
            compose_script_config(
                "translate",
                [
                    f"checkpoint={back}",
                    f"input={tmp_path / 'in.en'}",
                    f"output={tmp_path / 'back.de'}",
                    "generation.beam_size=2",
                    "generation.max_len_a=0",
                    "generation.max_len_b=6",
                    "progress=false",
                ],
            )
        )
        == 2
    )
    assert (tmp_path / "back.de").read_text(encoding="utf-8").split("\n") == hyps
