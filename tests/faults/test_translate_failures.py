"""A line that cannot be translated (longer than a model with learned positions can
read) gets a per-line error; every other line is translated and written."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO_ROOT
from tests.faults.conftest import run_script
from tests.generation.helpers import make_run_dir
from transformer.config import GenerationConfig
from transformer.generation import translate_sentences

MAX_POSITIONS = 24
LINES = ["A man is riding a bike.", " ".join(["A dog runs in the park."] * 12), "", "Two dogs play in the snow."]


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory):
    """A tiny run whose model has 24 learned positions."""
    return make_run_dir(
        tmp_path_factory.mktemp("learned") / "run", position__name="learned", max_positions=MAX_POSITIONS
    )


@pytest.fixture(scope="module")
def input_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("input") / "in.en"
    p.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return p


def _translate_script():
    spec = importlib.util.spec_from_file_location("_translate_script", REPO_ROOT / "scripts" / "translate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_translate_sentences_reports_the_long_sentence_and_translates_the_others(learned_run):
    run_dir, model, tok, _ = learned_run
    ids = [tok.encode(line) for line in LINES]
    assert len(ids[1]) > MAX_POSITIONS
    gen = GenerationConfig(beam_size=2, max_len_a=1.0, max_len_b=5)
    errors: dict[int, str] = {}
    hyps = translate_sentences(model, ids, gen, "cpu", errors=errors)
    assert list(errors) == [1] and "model.max_positions" in errors[1]
    assert hyps[1] == [] and hyps[2] == []  # the long line failed, the empty line stays empty
    assert hyps[0] and hyps[3]
    alone = translate_sentences(model, [ids[0], ids[3]], gen, "cpu")
    assert [h[0].tokens for h in alone] == [hyps[0][0].tokens, hyps[3][0].tokens]
    with pytest.raises(ValueError, match="sentence 1: the source has"):
        translate_sentences(model, ids, gen, "cpu")  # without ``errors``: a clear error, as before


def test_translate_writes_every_other_line_and_exits_1(learned_run, input_file, tmp_path):
    out = tmp_path / "out.de"
    res = run_script(
        "translate",
        f"checkpoint={learned_run[0]}",
        f"input={input_file}",
        f"output={out}",
        "generation.beam_size=2",
        "progress=false",
        cwd=tmp_path,
    )
    assert res.returncode == 1
    assert "error: line 2:" in res.stderr and "model.max_positions" in res.stderr and "Traceback" not in res.stderr
    assert [line for line in res.stderr.splitlines() if line.startswith("error: line")] == [
        line for line in res.stderr.splitlines() if line.startswith("error: line 2:")
    ]
    assert "error: 1 of 4 lines could not be translated" in res.stderr
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(LINES) and lines[1] == "" and lines[2] == ""
    run_dir, model, tok, tgt = learned_run
    expected = translate_sentences(
        model,
        [tok.encode(LINES[0]), tok.encode(LINES[3])],
        GenerationConfig(beam_size=2, max_len_a=1.0, max_len_b=5),
        "cpu",
    )
    assert [lines[0], lines[3]] == [tgt.decode(h[0].tokens) for h in expected]


def test_outputs_that_would_pass_the_last_position_stop_at_the_last_position(learned_run, tmp_path):
    """Sources that fit but whose allowed (here: required) output length passes the learned positions
    are translated up to the last position: search stops at its length bound, nothing fails."""
    run_dir, model, tok, _ = learned_run
    src = "A dog runs in the park."
    assert len(tok.encode(src)) <= MAX_POSITIONS - 1
    p = tmp_path / "in.en"
    p.write_text(f"A man.\n{src}\nA woman.\n", encoding="utf-8")
    out = tmp_path / "out.de"
    script = _translate_script()
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            config_name="translate",
            overrides=[
                f"checkpoint={run_dir}",
                f"input={p}",
                f"output={out}",
                "generation.strategy=greedy",
                "generation.max_len_a=3",
                "generation.max_len_b=40",
                "generation.min_len=30",
                "progress=false",
            ],
        )
    assert script.run(cfg) == 3  # no line failed
    assert len(out.read_text(encoding="utf-8").split("\n")[:-1]) == 3
    gen = GenerationConfig(strategy="greedy", max_len_a=3, max_len_b=40, min_len=30)
    for hyps in translate_sentences(model, [tok.encode(line) for line in ("A man.", src, "A woman.")], gen, "cpu"):
        assert len(hyps[0].tokens) == MAX_POSITIONS  # BOS + 23 tokens fill the 24 positions; then the forced EOS
