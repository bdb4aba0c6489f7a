"""Every test number of a run is reproducible from its folder.

A ``train.average_last > 0`` run saves the averaged weights it tests as ``checkpoint_avg.safetensors``,
``results.json`` names that file (``test_weights``), and ``scripts/evaluate.py checkpoint=RUN`` loads
exactly it: the BLEU and the hypotheses come out byte for byte as the training's final test wrote
them. A folder whose ``results.json`` names no file (written before the record) falls back to
``checkpoint_best`` and says so on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from tests.conftest import REPO_ROOT
from tests.training.conftest import small_config
from transformer.config import ConfigError
from transformer.generation import find_checkpoint, load_run
from transformer.training.checkpoint import average_checkpoints
from transformer.training.job import run as training_run
from transformer.training.job.run import train

SPLIT = "test_2016_flickr"


@pytest.fixture(scope="module")
def averaged_run(small_corpus, tmp_path_factory):
    """A tiny run of 6 updates, numbered checkpoints at 2, 4, 6, the last 2 averaged for the test."""
    run = tmp_path_factory.mktemp("averaged") / "run"
    train(small_config(small_corpus, run, "train.save_every=2", "train.average_last=2", "train.keep_last=3"))
    return run


def test_the_average_is_saved_and_named_by_results_json(averaged_run) -> None:
    results = json.loads((averaged_run / "results.json").read_text())
    assert results["final_model"] == "average of checkpoint_4, checkpoint_6"
    assert results["test_weights"] == "checkpoint_avg.safetensors"
    saved = averaged_run / "checkpoint_avg.safetensors"
    with safe_open(str(saved), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert json.loads(meta["averaged_from"]) == ["checkpoint_4", "checkpoint_6"]
    assert json.loads(meta["model_config"])["d_model"] == 32
    expected = average_checkpoints([averaged_run / "checkpoint_4", averaged_run / "checkpoint_6"])
    assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in expected)
    # it differs from the best and the last checkpoint: loading those would score another model
    last = load_run(averaged_run / "checkpoint_last").model.state_dict()
    assert any(not torch.equal(last[k], tensors[k]) for k in tensors if tensors[k].is_floating_point())


def test_evaluate_checkpoint_run_reproduces_the_test_byte_for_byte(averaged_run, tmp_path) -> None:
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "evaluate.py"),
        f"checkpoint={averaged_run}",
        f"output_dir={out}",
        "progress=false",
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-2000:]
    said = [line for line in res.stderr.splitlines() if "loading" in line]
    assert said == [
        f"{averaged_run}: loading checkpoint_avg.safetensors, the weights of results.json's test "
        "scores (average of checkpoint_4, checkpoint_6)"
    ]
    trained = json.loads((averaged_run / "results.json").read_text())
    evaluated = json.loads((out / "results.json").read_text())
    assert evaluated["checkpoint"] == str(averaged_run / "checkpoint_avg.safetensors")
    assert evaluated["splits"][SPLIT]["bleu"] == trained["test"][SPLIT]["bleu"] == trained["bleu"]
    assert evaluated["splits"][SPLIT]["chrf"] == trained["chrf"]
    assert (out / f"{SPLIT}.txt").read_bytes() == (averaged_run / "hyps" / f"{SPLIT}.txt").read_bytes()


def test_an_older_folder_falls_back_to_its_best_checkpoint_and_says_so(averaged_run, tmp_path, capsys) -> None:
    old = tmp_path / "old"
    old.mkdir()
    for f in averaged_run.iterdir():
        if f.is_file() and f.name != "checkpoint_avg.safetensors":
            (old / f.name).write_bytes(f.read_bytes())
    results = json.loads((old / "results.json").read_text())
    del results["test_weights"]  # as results.json was written before the record
    (old / "results.json").write_text(json.dumps(results))
    assert find_checkpoint(old) == (old, old / "checkpoint_best.safetensors")
    assert capsys.readouterr().err == (
        f"{old}: loading checkpoint_best.safetensors, the best checkpoint else the last: results.json, older "
        "than its test_weights record, says its test scores came from average of checkpoint_4, checkpoint_6\n"
    )
    (old / "results.json").unlink()  # a run still training reports no numbers: its best, else its last, quietly
    assert find_checkpoint(old)[1].name == "checkpoint_best.safetensors"
    assert capsys.readouterr().err == ""


def test_a_named_file_that_is_gone_falls_back_and_says_so(averaged_run, tmp_path, capsys) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    for name in ("results.json", "checkpoint_last.safetensors"):
        (gone / name).write_bytes((averaged_run / name).read_bytes())
    assert find_checkpoint(gone)[1].name == "checkpoint_last.safetensors"
    assert "results.json's test weights checkpoint_avg.safetensors are missing" in capsys.readouterr().err


def test_a_new_run_whose_average_its_checkpoints_cannot_give_is_refused_before_any_work(small_corpus, tmp_path) -> None:
    run = tmp_path / "refused"
    with pytest.raises(ConfigError, match=r"train\.average_last=2 averages numbered checkpoints, which only"):
        train(small_config(small_corpus, run, "train.save_every=0", "train.average_last=2"))
    assert not run.exists() or not any(run.iterdir())


def test_a_folder_trained_before_the_averaging_check_still_resumes(small_corpus, tmp_path, monkeypatch) -> None:
    """A run trained with ``average_last`` but no ``save_every`` (allowed before the check) continues
    as it was trained: its final test falls back to ``checkpoint_best`` and says so."""
    run = tmp_path / "old"
    args = ("train.save_every=0", "train.average_last=2", "train.validate_every=2")
    with monkeypatch.context() as m:
        m.setattr(training_run, "check_checkpoint_averaging", lambda t: None)
        train(small_config(small_corpus, run, *args, "train.max_updates=2"))
    results = train(small_config(small_corpus, run, *args, "train.max_updates=4", "train.resume=true"))
    assert results["updates"] == 4 and results["final_model"] == "checkpoint_best"
