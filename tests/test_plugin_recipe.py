"""docs/plugins.md's complete FFN plugin with a field (examples/plugins/tempglu) and its position-encoding
plugin (examples/plugins/relbias) as the page shows them: their files in full, the kit, a few updates of
training with their fields reaching the model, and the page's sweep of the FFN's field, two values,
compared with significance from the run folders alone."""

from __future__ import annotations

import csv
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

from safetensors.torch import load_file

from tests.conftest import REPO_ROOT, multi30k_excerpt, parallel_text_args
from tests.training.conftest import small_config, small_corpus  # noqa: F401 (fixture)
from transformer.testing import CHECKS, check_option

PAGE = REPO_ROOT / "docs" / "plugins.md"
TEMPGLU = REPO_ROOT / "examples" / "plugins" / "tempglu"
RELBIAS = REPO_ROOT / "examples" / "plugins" / "relbias"


def _blocks(text: str) -> list[str]:
    """The contents of the page's fenced code blocks."""
    return re.findall(r"^```\w*\n(.*?)^```$", text, flags=re.M | re.S)


def test_the_page_shows_the_plugin_and_the_ladder_steps_in_full():
    blocks = _blocks(PAGE.read_text(encoding="utf-8"))
    for file in (
        TEMPGLU / "__init__.py",
        RELBIAS / "__init__.py",
        TEMPGLU / "configs" / "ladder" / "step5_tempglu.yaml",
        REPO_ROOT / "examples" / "plugins" / "diff_attention" / "configs" / "ladder" / "step5_diff.yaml",
    ):
        assert file.read_text(encoding="utf-8") in blocks, f"{file} is not shown in full in {PAGE.name}"


def test_the_plugin_passes_the_kit():
    check_option(
        "model/ffn", "tempglu", plugins=[TEMPGLU], checks=[c for c in CHECKS if c != "compiles"], **{"ffn.tau0": 0.5}
    )


def test_the_plugin_trains_and_its_temperature_starts_at_tau0_and_learns(small_corpus, tmp_path):  # noqa: F811
    from transformer.training.job.run import train

    run = tmp_path / "run"
    cfg = small_config(
        small_corpus,
        run,
        f"plugins=[{TEMPGLU}]",
        "model/ffn=tempglu",
        "model.ffn.tau0=0.5",
        "train.max_updates=3",
        "train.save_every=1",
        "train.keep_last=0",
    )
    results = train(cfg)
    assert results["updates"] == 3 and results["config"]["model"]["ffn"]["tau0"] == 0.5
    first = {k: v for k, v in load_file(run / "checkpoint_1.safetensors").items() if k.endswith("log_tau")}
    last = {k: v for k, v in load_file(run / "checkpoint_3.safetensors").items() if k.endswith("log_tau")}
    assert len(first) == 4  # one per FFN of the 2+2 layers
    assert all(abs(float(v) - math.log(0.5)) < 0.05 for v in first.values())  # one update from tau0
    assert any(float(last[k]) != float(first[k]) for k in first)  # learned


def test_the_position_plugin_passes_the_kit_on_both_families():
    check_option(
        "model/position",
        "relbias",
        plugins=[RELBIAS],
        checks=[c for c in CHECKS if c != "compiles"],
        **{"position.num_buckets": 16},
    )


def test_the_position_plugin_trains_and_its_bias_learns(small_corpus, tmp_path):  # noqa: F811
    from transformer.training.job.run import train

    run = tmp_path / "run"
    cfg = small_config(
        small_corpus,
        run,
        f"plugins=[{RELBIAS}]",
        "model/position=relbias",
        "model.position.num_buckets=16",
        "train.max_updates=2",
        "train.validate_every=0",
        "train.save_every=1",
        "train.keep_last=0",
    )
    results = train(cfg)
    assert results["updates"] == 2 and results["config"]["model"]["position"]["num_buckets"] == 16
    biases = {
        k: v for k, v in load_file(run / "checkpoint_2.safetensors").items() if k.endswith("position.bias.weight")
    }
    assert biases and all(v.shape == (16, 4) for v in biases.values())  # (num_buckets, n_heads) per stack
    assert any(float(v.abs().max()) > 0 for v in biases.values())  # learned from zero


def _page_command(marker: str) -> list[str]:
    """The words of the page's command line holding ``marker``, without the environment and ``python``."""
    line = next(ln for ln in PAGE.read_text(encoding="utf-8").splitlines() if marker in ln)
    words = shlex.split(line)
    return words[words.index("python") + 2 :]


def test_the_pages_sweep_of_the_field_gives_a_row_per_value_with_p_values_from_the_folders(tmp_path):
    corpus = multi30k_excerpt(tmp_path / "corpus", {"train": 200, "val": 8, "test_2016_flickr": 12})
    sweep = [
        w.replace("examples/plugins/tempglu", str(TEMPGLU))
        .replace("model.ffn.tau0=0.5,1,2", "model.ffn.tau0=0.5,2")
        .replace("seed=1,2", "seed=1")
        .replace("hydra.sweep.dir=runs/tempglu_tau", f"hydra.sweep.dir={tmp_path / 'runs'}")
        for w in _page_command("model.ffn.tau0=0.5,1,2")
    ]
    assert f"hydra.sweep.dir={tmp_path / 'runs'}" in sweep
    small = [
        *parallel_text_args(corpus, 200),
        "train.max_updates=2",
        "train.validate_every=2",
        "train.valid_bleu_subset=4",
        "train.save_every=0",
        "train.average_last=0",
        "train.max_tokens=600",
        "lr_scheduler.warmup_updates=2",
        "generation.beam_size=1",
        "generation.max_len_b=5",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMER_DATA_DIR"}
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *sweep, *small],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert runs == ["step5_tempglu_seed1_tau0=0.5", "step5_tempglu_seed1_tau0=2"]  # one folder per value
    shutil.rmtree(corpus)  # the folders alone: the references travel with them
    compare = [
        w.replace("runs/tempglu_tau", str(tmp_path / "runs")).replace("tau0=1.0", "tau0=0.5")
        for w in _page_command("scripts/compare.py runs/tempglu_tau")
    ]
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "compare.py"), *compare],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with (tmp_path / "runs" / "comparison" / "comparison.csv").open(encoding="utf-8") as f:
        rows = {row["label"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["step5_tempglu, model.ffn.tau0=0.5", "step5_tempglu, model.ffn.tau0=2.0"], rows
    assert rows["step5_tempglu, model.ffn.tau0=2.0"]["p_value"] not in ("", "None")
    assert "No p-values" not in out.stdout
