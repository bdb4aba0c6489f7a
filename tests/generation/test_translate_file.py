"""transformer.generation.translate_file (the work of scripts/translate.py), called in-process on a
tiny run folder (tests/generation/helpers.make_run_dir)."""

from __future__ import annotations

import gzip
import io

import pytest

from tests.generation.helpers import compose_script_config, make_run_dir
from transformer.config import ConfigError, GenerationConfig
from transformer.generation import (
    LinesFailed,
    LoadError,
    detokenize,
    open_input,
    read_chunks,
    translate_file,
    translate_sentences,
)

LINES = ["A man is riding a bike.", "", "Two dogs play in the snow.", "A girl in a red dress smiles."]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("translate_file") / "run")


@pytest.fixture
def input_file(tmp_path):
    p = tmp_path / "in.en"
    p.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return p


def _cfg(*overrides: str):
    return compose_script_config("translate", ["progress=false", *overrides])


def _by_hand(run, **gen) -> list[str]:
    """What translate_sentences + detokenize give for LINES (an empty line stays empty)."""
    _, model, src_tok, tgt_tok = run
    hyps = translate_sentences(
        model, [src_tok.encode(s) for s in LINES], GenerationConfig(**{"max_len_a": 1.0, "max_len_b": 5, **gen}), "cpu"
    )
    return detokenize(hyps, tgt_tok)


def test_a_file_is_translated_line_by_line_into_a_file(run, input_file, tmp_path, capsys):
    out = tmp_path / "out.de"
    n = translate_file(_cfg(f"checkpoint={run[0]}", f"input={input_file}", f"output={out}", "generation.beam_size=3"))
    assert n == len(LINES)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == _by_hand(run, beam_size=3)
    captured = capsys.readouterr()
    assert captured.out == ""  # everything went to the file
    assert captured.err.startswith("translated 4 of 4 lines in ")  # the empty line counts and "beam 3)" in captured.err


def test_gzip_input_chunks_and_stdout_give_the_same_lines(run, input_file, tmp_path, capsys):
    gz = tmp_path / "in.en.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(input_file.read_text(encoding="utf-8"))
    translate_file(_cfg(f"checkpoint={run[0]}", f"input={gz}", "buffer_lines=1", "generation.strategy=greedy"))
    assert capsys.readouterr().out.split("\n")[:-1] == _by_hand(run, strategy="greedy")


def test_nbest_lines_carry_index_text_score_and_logprob(run, input_file, capsys):
    translate_file(_cfg(f"checkpoint={run[0]}", f"input={input_file}", "generation.beam_size=3", "generation.nbest=2"))
    rows = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 1, 2, 2, 3, 3]
    assert rows[2] == ["1", "", "0.000000", "0.000000"]  # the empty line: one empty hypothesis
    assert all(float(r[2]) <= 0 and float(r[3]) <= 0 for r in rows)


def test_an_untranslatable_line_is_reported_left_empty_and_raised_at_the_end(tmp_path, capsys):
    """A line longer than the model's learned positions: LinesFailed after every other line was written."""
    run = make_run_dir(tmp_path / "learned", position__name="learned", max_positions=24)
    long_line = " ".join(["A dog runs in the park."] * 12)
    src = tmp_path / "in.en"
    src.write_text(f"A man.\n{long_line}\nA woman.\n", encoding="utf-8")
    out = tmp_path / "out.de"
    with pytest.raises(LinesFailed, match=r"^1 of 3 lines could not be translated"):
        translate_file(_cfg(f"checkpoint={run[0]}", f"input={src}", f"output={out}", "generation.strategy=greedy"))
    _, model, src_tok, tgt_tok = run
    others = translate_sentences(
        model,
        [src_tok.encode("A man."), src_tok.encode("A woman.")],
        GenerationConfig(strategy="greedy", max_len_a=1.0, max_len_b=5),
        "cpu",
    )
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert lines == [detokenize(others, tgt_tok)[0], "", detokenize(others, tgt_tok)[1]]
    err = capsys.readouterr().err
    assert "error: line 2: the source has" in err and "its output line is left empty" in err


def test_user_errors_are_raised_as_such(run, input_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="input file not found"):
        translate_file(_cfg(f"checkpoint={run[0]}", f"input={tmp_path / 'missing.en'}"))
    with pytest.raises(LoadError, match="checkpoint not found"):
        translate_file(_cfg(f"checkpoint={tmp_path / 'no_run'}", f"input={input_file}"))
    with pytest.raises(ConfigError, match="strategy"):
        translate_file(_cfg(f"checkpoint={run[0]}", f"input={input_file}", "generation.strategy=viterbi"))


def test_read_chunks_and_open_input(tmp_path, monkeypatch):
    stream = io.StringIO("a\r\nb\n\nc")
    assert list(read_chunks(stream, 2)) == [["a", "b"], ["", "c"]]
    assert list(read_chunks(io.StringIO(""), 3)) == []
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("é\n\xff".encode("latin-1"))))
    with open_input("-") as f:  # stdin as UTF-8, undecodable bytes replaced
        assert f.read() == "\ufffd\n\ufffd"
    with pytest.raises(FileNotFoundError, match=r"input file not found: .*nothing\.en"):
        open_input(str(tmp_path / "nothing.en"))
