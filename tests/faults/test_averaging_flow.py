"""Checkpoint averaging as docs/decoding.md shows it, end to end: numbered checkpoints
from ``train.save_every``, ``--num-last`` above what exists averages what there is (with a warning),
and an average written outside the run folder can be translated and evaluated."""

from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file

from tests.faults.conftest import SIZES, load_script, run_script, script_config
from transformer.training.checkpoint import load_checkpoint


def test_average_outside_the_run_folder_translates(trained_run, gappy_corpus, tmp_path, capsys):
    avg = tmp_path / "elsewhere" / "avg.safetensors"
    load_script("average_checkpoints").main(["--inputs", str(trained_run), "--num-last", "5", "--output", str(avg)])
    out = capsys.readouterr()
    assert "warning: --num-last=5" in out.err and "averaged 3 checkpoints" in out.out
    states = [load_checkpoint(trained_run, f"checkpoint_{u}")[0] for u in (2, 4, 6)]
    name = "output_proj.weight"
    torch.testing.assert_close(load_file(avg)[name], sum(s[name] for s in states) / 3)
    src = gappy_corpus / "test_2016_flickr.en"
    hyps = tmp_path / "avg.de"
    load_script("translate").run(
        script_config(
            "translate",
            f"checkpoint={avg}",
            f"input={src}",
            f"output={hyps}",
            "generation.strategy=greedy",
            "progress=false",
        )
    )
    assert len(hyps.read_text(encoding="utf-8").split("\n")[:-1]) == SIZES["test_2016_flickr"]
    load_script("evaluate").run(
        script_config(
            "evaluate",
            f"checkpoint={avg}",
            "splits=[test_2016_flickr]",
            "limit=5",
            f"data.root={gappy_corpus}",
            "generation.strategy=greedy",
            "progress=false",
        )
    )
    assert (trained_run / "eval" / "avg" / "results.json").is_file()  # results go to the run it came from


def test_a_run_without_numbered_checkpoints_names_train_save_every(trained_run, tmp_path):
    run = tmp_path / "default_run"
    shutil.copytree(trained_run, run)
    for f in run.glob("checkpoint_[0-9]*"):
        f.unlink()
    res = run_script(
        "average_checkpoints",
        "--inputs",
        str(run),
        "--num-last",
        "5",
        "--output",
        str(tmp_path / "avg.safetensors"),
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "train.save_every" in res.stderr and "checkpoint_last" in res.stderr and "Traceback" not in res.stderr
