"""Loading a trained run folder / checkpoint (transformer.generation.loading)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import save_file

from tests.generation.helpers import corpus_lines, make_run_dir
from transformer.data.tokenizer import Tokenizer
from transformer.generation import LoadError, load_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("run") / "run")


def same_logits(a, b, arch: str = "encoder_decoder") -> None:
    src = torch.tensor([[10, 11, 12, 3]])
    prev = torch.tensor([[2, 20, 21]])
    with torch.no_grad():
        if arch == "encoder_decoder":
            torch.testing.assert_close(a(src, prev), b(src, prev))
        else:
            torch.testing.assert_close(a(prev), b(prev))


def test_load_from_folder_file_state_and_stem(run) -> None:
    run_dir, model, tok, _ = run
    for path in (
        run_dir,
        run_dir / "checkpoint_best.safetensors",
        run_dir / "checkpoint_best.pt",
        run_dir / "checkpoint_best",
        str(run_dir),
    ):
        loaded = load_run(path)
        m, toks, cfg = loaded
        assert not m.training and loaded.run_dir == run_dir
        assert toks.src is toks.tgt and len(toks.src) == len(tok)
        assert cfg.generation.max_len_b == 5 and cfg.model.d_model == 32
        same_logits(m, model)


def test_config_from_training_state_and_overrides(run, tmp_path) -> None:
    run_dir, model, _, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    (copy / "config.yaml").unlink()
    m, _, cfg = load_run(copy / "checkpoint_best.safetensors", overrides=["generation.beam_size=2"])
    assert cfg.generation.beam_size == 2 and cfg.generation.max_len_b == 5
    same_logits(m, model)
    (copy / "checkpoint_best.pt").unlink()
    with pytest.raises(LoadError, match="no config"):
        load_run(copy)


@pytest.mark.parametrize("arch,joint", [("decoder_only", True), ("encoder_decoder", False)])
def test_other_families_and_separate_vocabularies(tmp_path, arch: str, joint: bool) -> None:
    run_dir, model, src_tok, tgt_tok = make_run_dir(tmp_path / "r", arch=arch, joint=joint)
    m, toks, _ = load_run(run_dir)
    assert (toks.src is toks.tgt) == joint and len(toks.tgt) == len(tgt_tok)
    same_logits(m, model, arch)


def test_missing_checkpoint(tmp_path, run) -> None:
    with pytest.raises(LoadError, match="not found"):
        load_run(tmp_path / "nope")
    with pytest.raises(LoadError, match="no checkpoint in"):
        load_run(tmp_path)
    empty = tmp_path / "only_last"
    shutil.copytree(run[0], empty)
    for suffix in (".safetensors", ".pt", ".json"):
        (empty / f"checkpoint_best{suffix}").rename(empty / f"checkpoint_7{suffix}")
    with pytest.raises(LoadError, match="checkpoint_7.safetensors"):
        load_run(empty)
    assert load_run(empty / "checkpoint_7.safetensors").checkpoint.name == "checkpoint_7.safetensors"


def test_foreign_files(tmp_path, run) -> None:
    run_dir = tmp_path / "r"
    shutil.copytree(run[0], run_dir)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    with pytest.raises(LoadError, match="not a checkpoint of this project"):
        load_run(text)
    (run_dir / "checkpoint_best.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(LoadError, match="not a safetensors"):
        load_run(run_dir)
    save_file(
        {"bert.embeddings.word_embeddings.weight": torch.zeros(4, 4)}, str(run_dir / "checkpoint_best.safetensors")
    )
    with pytest.raises(LoadError, match="not a checkpoint of this project"):
        load_run(run_dir)
    state = {k: v.clone() for k, v in run[1].state_dict().items()}
    state.pop("output_proj.weight")
    save_file(state, str(run_dir / "checkpoint_best.safetensors"))
    with pytest.raises(LoadError, match="does not fit"):
        load_run(run_dir)


def test_tokenizer_that_does_not_match_the_weights(tmp_path, run) -> None:
    lines = corpus_lines()
    other = Tokenizer.train(lines["en"] + lines["de"], tmp_path / "other", vocab_size=200)
    with pytest.raises(LoadError, match=r"tokenizer .*200 pieces.*does not match"):
        load_run(run[0], src_tokenizer=tmp_path / "other.model")
    run_dir = tmp_path / "r"
    shutil.copytree(run[0], run_dir)
    shutil.copy(tmp_path / "other.model", run_dir / "spm.model")
    with pytest.raises(LoadError, match="250 rows"):
        load_run(run_dir)
    (run_dir / "spm.model").write_bytes(b"not a model")
    with pytest.raises(LoadError, match="SentencePiece"):
        load_run(run_dir)
    (run_dir / "spm.model").unlink()
    with pytest.raises(LoadError, match="no tokenizer"):
        load_run(run_dir)
    assert len(other) == 200


def test_a_rope_scaling_applies_at_test_time_to_a_rope_run_only(run, tmp_path) -> None:
    """``model.position.rope_scaling.*`` of translate.yaml / evaluate.yaml: the fields set become
    overrides of the run's config; the weights load unchanged into the model so scaled, which
    computes what a model built with that scaling computes (and differs from the unscaled one past
    the original length); a run trained without RoPE is refused naming the field and its position."""
    from omegaconf import OmegaConf

    from tests.conftest import tiny_model_config
    from transformer.generation import test_time_overrides
    from transformer.models import build_model

    script = OmegaConf.create(
        {
            "model": {
                "position": {
                    "rope_scaling": {
                        "rope_type": "dynamic",
                        "factor": 2.0,
                        "original_max_position_embeddings": 2,
                        "beta_fast": None,
                    }
                }
            },
            "generation": {"beam_size": 3},
        }
    )
    overrides = test_time_overrides(script)
    assert overrides == [
        "model.position.rope_scaling.rope_type=dynamic",
        "model.position.rope_scaling.factor=2.0",
        "model.position.rope_scaling.original_max_position_embeddings=2",
    ]
    assert test_time_overrides(OmegaConf.create({"generation": {}})) == []

    run_dir, model, tok, _ = make_run_dir(tmp_path / "rope", position__name="rope")
    scaled, _, cfg = load_run(run_dir, overrides=overrides)
    assert cfg.model.position.rope_scaling.rope_type == "dynamic"
    assert cfg.model.position.rope_scaling.original_max_position_embeddings == 2
    reference = build_model(
        tiny_model_config(
            position__name="rope",
            **{
                "position.rope_scaling.rope_type": "dynamic",
                "position.rope_scaling.factor": 2.0,
                "position.rope_scaling.original_max_position_embeddings": 2,
            },
        ),
        len(tok),
    ).eval()
    reference.load_state_dict(model.state_dict())
    same_logits(scaled, reference)
    with pytest.raises(AssertionError):  # four source tokens are past L0 = 2: the scaling changes the scores
        same_logits(scaled, model)
    same_logits(load_run(run_dir).model, model)  # without overrides, the run as trained

    with pytest.raises(
        LoadError,
        match=r"model\.position\.rope_scaling\.rope_type scales RoPE at test time, but "
        r".* was trained with model/position=sinusoidal",
    ):
        load_run(run[0], overrides=overrides)
    with pytest.raises(
        LoadError,
        match=r"with the test-time overrides model\.position\.rope_scaling\.rope_type=yarn "
        r"is invalid: .*needs model\.position\.rope_scaling\.original_max_position_embeddings",
    ):
        load_run(run_dir, overrides=["model.position.rope_scaling.rope_type=yarn"])
    for nothing in (["model.position.rope_scaling.factor=2"], ["model.position.rope_scaling.rope_type=default"]):
        with pytest.raises(
            LoadError,
            match=r"changes nothing at test time: .* has model\.position\.rope_scaling\."
            r"rope_type=default, which reads no other field",
        ):
            load_run(run_dir, overrides=nothing)
    yarn = [
        "model.position.rope_scaling.rope_type=yarn",
        "model.position.rope_scaling.factor=4.0",
        "model.position.rope_scaling.original_max_position_embeddings=8",
    ]
    yarn_dir, *_ = make_run_dir(
        tmp_path / "yarn",
        position__name="rope",
        **{
            "position.rope_scaling.rope_type": "yarn",
            "position.rope_scaling.factor": 4.0,
            "position.rope_scaling.original_max_position_embeddings": 8,
        },
    )
    with pytest.raises(LoadError, match="changes nothing at test time: .* was trained with that RoPE scaling"):
        load_run(yarn_dir, overrides=yarn)
    assert (
        load_run(
            yarn_dir, overrides=["model.position.rope_scaling.rope_type=default"]
        ).cfg.model.position.rope_scaling.rope_type
        == "default"
    )
