"""scripts/translate.py and scripts/evaluate.py on a tiny run folder built here (no trainer needed).

The run folder mimics what training writes (config.yaml, spm.model, checkpoint_best.*), with a
SentencePiece model trained on a few hundred Multi30k lines from ../shared/data (synthetic lines when
the data is absent; the evaluate tests then skip).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.generation.helpers import REPO_ROOT, make_run_dir, shared_data_dir
from tests.generation.helpers import compose_script_config as _cfg
from tests.generation.helpers import load_script as _load_script
from transformer.config import GenerationConfig
from transformer.evaluation import corpus_scores
from transformer.generation import translate_sentences

SENTENCES = ["A man is riding a bike.", "", "Two dogs play in the snow.", "A girl in a red dress smiles."]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("scripts") / "run")


@pytest.fixture(scope="module")
def input_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("input") / "in.en"
    p.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return p


def expected(run, **gen) -> list:
    _, model, tok, tgt = run
    cfg = GenerationConfig(**{"max_len_a": 1.0, "max_len_b": 5, **gen})
    ids = [tok.encode(s) for s in SENTENCES if s]
    return translate_sentences(model, ids, cfg, "cpu")


def test_translate_file_in_process(run, input_file, tmp_path, capsys) -> None:
    script = _load_script("translate")
    out = tmp_path / "out.txt"
    n = script.run(
        _cfg("translate", [f"checkpoint={run[0]}", f"input={input_file}", f"output={out}", "generation.beam_size=3"])
    )
    assert n == len(SENTENCES)
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    hyps = iter(expected(run, beam_size=3))
    want = [run[3].decode(next(hyps)[0].tokens) if s else "" for s in SENTENCES]
    assert lines == want


def test_translate_nbest_with_scores(run, input_file, capsys) -> None:
    script = _load_script("translate")
    script.run(
        _cfg(
            "translate",
            [
                f"checkpoint={run[0]}",
                f"input={input_file}",
                "generation.nbest=2",
                "generation.beam_size=3",
                "buffer_lines=1",
            ],
        )
    )
    rows = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    hyps = expected(run, beam_size=3, nbest=2)
    got_ids = [int(r[0]) for r in rows]
    assert got_ids == [0, 0, 1, 2, 2, 3, 3]
    scores = [float(r[2]) for r in rows if r[1]]
    assert scores == pytest.approx([h.score for hs in hyps for h in hs], abs=1e-5)


def test_translate_cli_stdin(run, tmp_path) -> None:
    cmd = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "translate.py"),
        f"checkpoint={run[0]}",
        "input=-",
        "generation.strategy=greedy",
    ]
    res = subprocess.run(cmd, input="\n".join(SENTENCES) + "\n", capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    hyps = iter(expected(run, strategy="greedy"))
    assert res.stdout.split("\n")[:-1] == [run[3].decode(next(hyps)[0].tokens) if s else "" for s in SENTENCES]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / ".hydra").exists()


def test_translate_main_exits_2_with_a_message(tmp_path, monkeypatch, capsys) -> None:
    script = _load_script("translate")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["translate.py", f"checkpoint={tmp_path / 'missing'}", "input=-"])
    with pytest.raises(SystemExit) as exc:
        script.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "checkpoint not found" in err and "Traceback" not in err


def test_translate_clear_errors_in_process(run, input_file, tmp_path) -> None:
    from transformer.config import ConfigError
    from transformer.data.tokenizer import Tokenizer
    from transformer.generation import LoadError

    script = _load_script("translate")
    foreign = tmp_path / "model.safetensors"
    foreign.write_bytes(b"not weights")
    with pytest.raises(LoadError, match="not a safetensors"):
        script.run(_cfg("translate", [f"checkpoint={foreign}", f"input={input_file}"]))
    Tokenizer.train(SENTENCES * 20, tmp_path / "other", vocab_size=60)
    with pytest.raises(LoadError, match="does not match"):
        script.run(
            _cfg(
                "translate",
                [f"checkpoint={run[0]}", f"input={input_file}", f"src_tokenizer={tmp_path / 'other.model'}"],
            )
        )
    with pytest.raises(ConfigError, match="strategy"):
        script.run(_cfg("translate", [f"checkpoint={run[0]}", f"input={input_file}", "generation.strategy=viterbi"]))


@pytest.fixture(scope="module")
def data_root() -> Path:
    d = shared_data_dir()
    if not (d / "multi30k" / "test_2016_flickr.en.gz").is_file():
        pytest.skip(f"Multi30k not found under {d}; set TRANSFORMER_DATA_DIR")
    return d


def test_evaluate_checkpoint_and_bootstrap(run, data_root, tmp_path, capsys) -> None:
    script = _load_script("evaluate")
    res = script.run(
        _cfg(
            "evaluate",
            [
                f"checkpoint={run[0]}",
                "splits=[test_2016_flickr]",
                "limit=12",
                f"output_dir={tmp_path / 'a'}",
                f"data.root={data_root}",
                "generation.beam_size=2",
            ],
        )
    )
    s = res["splits"]["test_2016_flickr"]
    assert s["sentences"] == 12 and "tok:13a" in s["bleu_signature"] and "nc:6" in s["chrf_signature"]
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["splits"]["test_2016_flickr"]["bleu"] == pytest.approx(s["bleu"])
    hyps = (tmp_path / "a" / "test_2016_flickr.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 12
    # tokenized BLEU is used when asked (the run's data.bleu_tokenize for multi30k_tok_*)
    res_tok = script.run(
        _cfg(
            "evaluate",
            [
                f"checkpoint={run[0]}",
                "splits=[test_2016_flickr]",
                "limit=12",
                f"output_dir={tmp_path / 'b'}",
                f"data.root={data_root}",
                "generation.strategy=greedy",
                "tokenize=none",
                f"baseline={tmp_path / 'a' / 'test_2016_flickr.txt'}",
            ],
        )
    )
    assert "tok:none" in res_tok["splits"]["test_2016_flickr"]["bleu_signature"]
    boot = res_tok["bootstrap"]
    assert list(boot) == ["baseline", "checkpoint"] and 0 < boot["checkpoint"]["p_value"] <= 1
    assert "paired bootstrap" in capsys.readouterr().out


def test_evaluate_files_mode_identical_scores_100(tmp_path, capsys) -> None:
    script = _load_script("evaluate")
    refs = tmp_path / "ref.txt"
    refs.write_text("\n".join(s for s in SENTENCES if s) + "\n", encoding="utf-8")
    other = tmp_path / "other.txt"
    other.write_text("A man.\nTwo dogs.\nA girl.\n", encoding="utf-8")
    res = script.run(_cfg("evaluate", [f"refs={refs}", f"hyps=[{other},{refs}]", "bootstrap_samples=100"]))
    assert res["scores"][str(refs)]["bleu"] == pytest.approx(100.0)
    assert res["scores"][str(refs)] == corpus_scores(refs.read_text().splitlines(), refs.read_text().splitlines())
    assert res["bootstrap"][str(refs)]["bleu"] == pytest.approx(100.0)


def test_evaluate_main_exits_2_with_a_message(tmp_path, monkeypatch, capsys) -> None:
    script = _load_script("evaluate")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["evaluate.py", f"checkpoint={tmp_path / 'x'}"])
    with pytest.raises(SystemExit) as exc:
        script.main()
    assert exc.value.code == 2 and "checkpoint not found" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["evaluate.py", f"refs={tmp_path / 'nothing.txt'}", "hyps=[a.txt]"])
    with pytest.raises(SystemExit) as exc:
        script.main()
    assert exc.value.code == 2 and "file not found" in capsys.readouterr().err


def test_translate_with_a_rope_scaling_at_test_time(run, input_file, tmp_path, capsys) -> None:
    """``model.position.rope_scaling.*`` on translate's command line decodes with the scaled model (the
    run's weights); a run without RoPE is refused in one line, exit status 2."""
    from tests.conftest import tiny_model_config
    from transformer.models import build_model

    rope_dir, model, tok, _ = make_run_dir(tmp_path / "rope", position__name="rope")
    script = _load_script("translate")
    scaling = ["model.position.rope_scaling.rope_type=linear", "model.position.rope_scaling.factor=4"]
    out = tmp_path / "out.txt"
    script.run(
        _cfg(
            "translate",
            [f"checkpoint={rope_dir}", f"input={input_file}", f"output={out}", "generation.strategy=greedy", *scaling],
        )
    )
    reference = build_model(
        tiny_model_config(
            position__name="rope", **{"position.rope_scaling.rope_type": "linear", "position.rope_scaling.factor": 4.0}
        ),
        len(tok),
    ).eval()
    reference.load_state_dict(model.state_dict())
    gen = GenerationConfig(strategy="greedy", max_len_a=1.0, max_len_b=5)
    hyps = iter(translate_sentences(reference, [tok.encode(s) for s in SENTENCES if s], gen, "cpu"))
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == [
        tok.decode(next(hyps)[0].tokens) if s else "" for s in SENTENCES
    ]
    assert (
        "greedy, at test time model.position.rope_scaling.rope_type=linear model.position.rope_scaling.factor=4.0)"
        in capsys.readouterr().err
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "translate.py"),
            f"checkpoint={run[0]}",
            f"input={input_file}",
            *scaling,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model.position.rope_scaling.rope_type scales RoPE at test time, but" in proc.stderr
    assert "model/position=sinusoidal" in proc.stderr


def test_both_scripts_main_is_run_script_plugins_first_then_one_line_errors(monkeypatch, capsys) -> None:
    """``main`` of scripts/translate.py and scripts/evaluate.py is one helper of the package
    (transformer.cli.run_script): the run's plugins chosen, then the work, its user errors one line
    and an exit status."""
    from omegaconf import OmegaConf

    from transformer import cli

    assert _load_script("translate").run_script is _load_script("evaluate").run_script is cli.run_script
    seen = []
    monkeypatch.setattr(cli, "set_user_choice", lambda *a: seen.append(a))
    cfg = OmegaConf.create({"plugins": ["p"], "plugins_trust": True})
    assert cli.run_script(cfg, lambda c: seen.append("work") or 7, {}) == 7
    assert seen == [(["p"], True), "work"]

    def missing(_):
        raise FileNotFoundError("no such file: x")

    with pytest.raises(SystemExit) as exit_:
        cli.run_script(cfg, missing, {FileNotFoundError: 2})
    assert exit_.value.code == 2 and capsys.readouterr().err == "error: no such file: x\n"
