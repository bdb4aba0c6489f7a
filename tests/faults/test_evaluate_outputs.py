"""Issue #13 items 11, 12 and 16 (scripts side): evaluate.py accepts a single hypothesis path, names its
results by checkpoint (a second checkpoint does not overwrite the first), and translate.py /
evaluate.py show progress on stderr unless ``progress=false``."""

from __future__ import annotations

import json

from tests.faults.conftest import run_script


def test_evaluate_accepts_a_single_hyps_path(tmp_path):
    refs, hyps = tmp_path / "ref.de", tmp_path / "sys.de"
    refs.write_text("Ein Hund läuft.\nZwei Katzen.\n", encoding="utf-8")
    hyps.write_text("Ein Hund läuft.\nZwei Hunde.\n", encoding="utf-8")
    res = run_script("evaluate", f"refs={refs}", f"hyps={hyps}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"{hyps}: BLEU" in res.stdout and "file not found" not in res.stderr


def test_results_are_named_by_checkpoint(trained_run, gappy_corpus, tmp_path):
    common = ["splits=[test_2016_flickr]", "limit=6", f"data.root={gappy_corpus}", "progress=false",
              "generation.strategy=greedy"]
    for name in ("checkpoint_2", "checkpoint_best"):
        res = run_script("evaluate", f"checkpoint={trained_run / name}.safetensors", *common, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    first = json.loads((trained_run / "eval" / "checkpoint_2" / "results.json").read_text())
    second = json.loads((trained_run / "eval" / "checkpoint_best" / "results.json").read_text())
    assert first["checkpoint"].endswith("checkpoint_2.safetensors")
    assert second["checkpoint"].endswith("checkpoint_best.safetensors")


def test_decoding_progress_on_stderr_and_off_with_the_switch(trained_run, gappy_corpus, tmp_path):
    src = gappy_corpus / "test_2016_flickr.en"
    on = run_script("translate", f"checkpoint={trained_run}", f"input={src}", "generation.strategy=greedy",
                    cwd=tmp_path)
    assert on.returncode == 0, on.stderr
    assert "translate" in on.stderr and "line" in on.stderr and "30/" not in on.stdout  # tqdm: "translate: 30line [..]"
    assert "30line" in on.stderr.replace(" ", "")
    off = run_script("translate", f"checkpoint={trained_run}", f"input={src}", "generation.strategy=greedy",
                     "progress=false", cwd=tmp_path)
    assert off.returncode == 0 and "line [" not in off.stderr and "it/s" not in off.stderr
    assert off.stdout == on.stdout
    ev = run_script("evaluate", f"checkpoint={trained_run}", "splits=[test_2016_flickr]", "limit=10",
                    f"data.root={gappy_corpus}", "generation.strategy=greedy", f"output_dir={tmp_path / 'e'}",
                    cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    assert "test_2016_flickr: 100%" in ev.stderr and "10/10" in ev.stderr
