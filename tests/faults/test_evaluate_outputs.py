"""``evaluate.py`` accepts a single hypothesis path, names its results by checkpoint (a second
checkpoint does not overwrite the first), and ``translate.py`` / ``evaluate.py`` show progress on stderr
unless ``progress=false``."""

from __future__ import annotations

import json
import re

from tests.faults.conftest import load_script, run_script, script_config


def test_evaluate_accepts_a_single_hyps_path(tmp_path):
    refs, hyps = tmp_path / "ref.de", tmp_path / "sys.de"
    refs.write_text("Ein Hund läuft.\nZwei Katzen.\n", encoding="utf-8")
    hyps.write_text("Ein Hund läuft.\nZwei Hunde.\n", encoding="utf-8")
    res = run_script("evaluate", f"refs={refs}", f"hyps={hyps}", cwd=tmp_path)  # as typed on a command line
    assert res.returncode == 0, res.stderr
    assert f"{hyps}: BLEU" in res.stdout and "file not found" not in res.stderr


def test_results_are_named_by_checkpoint(trained_run, gappy_corpus):
    evaluate = load_script("evaluate")
    common = [
        "splits=[test_2016_flickr]",
        "limit=6",
        f"data.root={gappy_corpus}",
        "progress=false",
        "generation.strategy=greedy",
    ]
    for name in ("checkpoint_2", "checkpoint_best"):
        evaluate.run(script_config("evaluate", f"checkpoint={trained_run / name}.safetensors", *common))
    first = json.loads((trained_run / "eval" / "checkpoint_2" / "results.json").read_text())
    second = json.loads((trained_run / "eval" / "checkpoint_best" / "results.json").read_text())
    assert first["checkpoint"].endswith("checkpoint_2.safetensors")
    assert second["checkpoint"].endswith("checkpoint_best.safetensors")


def test_decoding_progress_on_stderr_and_off_with_the_switch(trained_run, gappy_corpus, tmp_path, capsys):
    translate, evaluate = load_script("translate"), load_script("evaluate")
    src = gappy_corpus / "test_2016_flickr.en"
    common = [f"checkpoint={trained_run}", f"input={src}", "generation.strategy=greedy"]
    translate.run(script_config("translate", *common, f"output={tmp_path / 'on.de'}"))
    err = capsys.readouterr().err
    assert re.search(r"translate: 30line \[", err), err[-500:]  # tqdm: lines done (no total for a stream)
    translate.run(script_config("translate", *common, f"output={tmp_path / 'off.de'}", "progress=false"))
    err = capsys.readouterr().err
    assert "line [" not in err and "line/s" not in err
    assert (tmp_path / "on.de").read_text() == (tmp_path / "off.de").read_text()
    evaluate.run(
        script_config(
            "evaluate",
            f"checkpoint={trained_run}",
            "splits=[test_2016_flickr]",
            "limit=10",
            f"data.root={gappy_corpus}",
            "generation.strategy=greedy",
            f"output_dir={tmp_path / 'e'}",
        )
    )
    err = capsys.readouterr().err
    assert "test_2016_flickr: 100%" in err and "10/10" in err
