"""scripts/translate.py and scripts/evaluate.py with checkpoint=[a,b,...] (an ensemble)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.generation.helpers import compose_script_config as _cfg
from tests.generation.helpers import load_script as _load_script
from tests.generation.helpers import make_run_dir, shared_data_dir

SENTENCES = ["A man is riding a bike.", "", "Two dogs play in the snow.", "A girl in a red dress smiles."]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ens_scripts")
    return make_run_dir(root / "a", seed=1), make_run_dir(root / "b", seed=2), make_run_dir(root / "c", vocab_size=200)


@pytest.fixture(scope="module")
def input_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("input") / "in.en"
    p.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return p


def test_translate_with_a_model_twice_equals_the_model(runs, input_file, tmp_path) -> None:
    script = _load_script("translate")
    a = runs[0][0]
    single, double = tmp_path / "single.txt", tmp_path / "double.txt"
    common = [f"input={input_file}", "generation.beam_size=3", "progress=false"]
    script.run(_cfg("translate", [f"checkpoint={a}", f"output={single}", *common]))
    script.run(_cfg("translate", [f"checkpoint=[{a},{a}]", f"output={double}", *common]))
    assert double.read_text(encoding="utf-8") == single.read_text(encoding="utf-8")
    assert len(single.read_text(encoding="utf-8").splitlines()) == len(SENTENCES)


def test_translate_refuses_another_vocabulary(runs, input_file, tmp_path, monkeypatch, capsys) -> None:
    script = _load_script("translate")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["translate.py", f"checkpoint=[{runs[0][0]},{runs[2][0]}]", f"input={input_file}"])
    with pytest.raises(SystemExit) as exc:
        script.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    assert "cannot join an ensemble" in err[0] and "same SentencePiece vocabulary" in err[0]


def test_evaluate_an_ensemble(runs, tmp_path) -> None:
    data_root = shared_data_dir()
    if not (data_root / "multi30k" / "test_2016_flickr.en.gz").is_file():
        pytest.skip(f"Multi30k not found under {data_root}; set TRANSFORMER_DATA_DIR")
    script = _load_script("evaluate")
    a, b = runs[0][0], runs[1][0]
    res = script.run(
        _cfg(
            "evaluate",
            [
                f"checkpoint=[{a},{b}]",
                "splits=[test_2016_flickr]",
                "limit=6",
                f"data.root={data_root}",
                "generation.beam_size=2",
                "progress=false",
            ],
        )
    )
    assert res["checkpoint"] == [str(a / "checkpoint_best.safetensors"), str(b / "checkpoint_best.safetensors")]
    (out,) = (a / "eval").glob("ensemble_2_*")
    assert json.loads((out / "results.json").read_text())["splits"]["test_2016_flickr"]["sentences"] == 6
    assert len((out / "test_2016_flickr.txt").read_text(encoding="utf-8").splitlines()) == 6
