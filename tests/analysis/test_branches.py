"""Branch studies in compare_sweeps: runs of another study (``experiment_name``) off the ladder share its
table, and ``compare_prev=False`` (``--no-prev``) tests each branch against the baseline only."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from tests.analysis.test_compare import _degrade, _refs, corpus, make_run  # noqa: F401 (fixtures)
from tests.conftest import REPO_ROOT, SHARED_DATA
from transformer.analysis import compare_sweeps, write_outputs


def as_branch(run_dir: Path, step: str | None = None, **model) -> Path:
    """Make a run folder one of ``experiment=branches``: its experiment name and choice, optionally
    another ladder step with model fields changed."""
    res = json.loads((run_dir / "results.json").read_text())
    res["config"]["experiment_name"] = "branches"
    res["choices"]["experiment"] = "branches"
    if step is not None:
        res["choices"]["ladder"] = step
    res["config"]["model"].update(model)
    (run_dir / "results.json").write_text(json.dumps(res))
    return run_dir


def test_the_study_name_neither_splits_a_configuration_nor_mixes_a_table(tmp_path, corpus):  # noqa: F811
    refs = _refs(corpus)
    make_run(tmp_path / "ladder" / "step5_gqa_seed1", corpus, "step5_gqa", 1, refs, bleu=40.0)
    make_run(tmp_path / "ladder" / "step5_gqa_seed2", corpus, "step5_gqa", 2, refs, bleu=41.0)
    as_branch(
        make_run(tmp_path / "branches" / "step5_qk_norm_seed1", corpus, "step5_qk_norm", 1, refs, bleu=42.0),
        qk_norm="rmsnorm",
    )
    # the baseline re-run by the branch study: the same configuration as the ladder's, a third seed
    as_branch(make_run(tmp_path / "branches" / "step5_gqa_seed3", corpus, "step5_gqa", 3, refs, bleu=39.0))
    comp = compare_sweeps([tmp_path / "ladder", tmp_path / "branches"], n_bootstrap=0)
    assert comp.mixed == [] and not any("differ" in n for n in comp.notes)
    assert [(r["label"], r["seeds"]) for r in comp.rows] == [("step5_gqa", "1 2 3"), ("step5_qk_norm", "1")]
    assert comp.baseline == "step5_gqa" and comp.rows[1]["delta_bleu"] == pytest.approx(2.0)


def test_a_recipe_difference_is_still_refused_across_studies(tmp_path, corpus):  # noqa: F811
    refs = _refs(corpus)
    make_run(tmp_path / "ladder" / "a", corpus, "step5_gqa", 1, refs, bleu=40.0)
    branch = as_branch(make_run(tmp_path / "branches" / "b", corpus, "step5_mla", 1, refs, bleu=41.0))
    res = json.loads((branch / "results.json").read_text())
    res["config"]["train"]["max_updates"] = 20
    (branch / "results.json").write_text(json.dumps(res))
    with pytest.raises(ValueError, match=r"train.max_updates: 10 \(a\); 20 \(b\)") as err:
        compare_sweeps([tmp_path / "ladder", tmp_path / "branches"], n_bootstrap=0)
    assert "experiment_name" not in str(err.value)


def test_no_prev_tests_each_configuration_against_the_baseline_only(tmp_path, corpus):  # noqa: F811
    """step5_gqa (baseline) and two branches off it: without the row above, the Holm family has two tests."""
    from transformer.analysis.stats import holm_bonferroni

    refs = _refs(corpus)
    make_run(tmp_path / "s" / "0", corpus, "step5_gqa", 1, _degrade(refs, 0.9, 1), bleu=10.0)
    as_branch(
        make_run(tmp_path / "s" / "1", corpus, "step5_mla", 1, _degrade(refs, 0.05, 1), bleu=20.0),
        attention={"name": "mla", "kv_lora_rank": 16},
    )
    as_branch(
        make_run(tmp_path / "s" / "2", corpus, "step5_qk_norm", 1, _degrade(refs, 0.5, 1), bleu=30.0), qk_norm="rmsnorm"
    )
    with_prev = compare_sweeps([tmp_path / "s"], n_bootstrap=100)
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=100, compare_prev=False)
    assert not comp.compare_prev and [r["label"] for r in comp.rows] == ["step5_gqa", "step5_mla", "step5_qk_norm"]
    for key in ("delta_prev_bleu", "p_value_prev", "p_value_prev_holm", "within_noise_prev"):
        assert [r[key] for r in comp.rows] == [None, None, None], key
    assert with_prev.rows[2]["p_value_prev"] is not None  # step5_qk_norm against step5_mla: not a comparison here
    p = {r["label"]: r["p_value"] for r in comp.rows[1:]}
    assert p == {r["label"]: r["p_value"] for r in with_prev.rows[1:]}  # the same tests against the baseline
    assert {r["label"]: r["p_value_holm"] for r in comp.rows[1:]} == holm_bonferroni(p)  # a family of two
    md = write_outputs(comp, tmp_path / "out")["markdown"].read_text()
    assert "| Configuration | Runs | BLEU | ΔBLEU | p Holm | chrF |" in md and "Δ prev" not in md
    assert "No comparison with the row above (--no-prev)" in md
    assert "| step5_mla | 1/1 | 20.00 | +10.00 |" in md


def test_a_branch_study_on_the_committed_ladder_runs(tmp_path):
    """The CLI on the ladder's committed step5_gqa runs and a branch study whose two runs are copies of them
    (experiment_name ``branches``, ``ladder=step5_qk_norm``, QK-norm on) with step4_rope's test output as
    their hypotheses: one table, no Δ prev, and each bucket's BLEU is sacreBLEU's on the real references."""
    ladder = REPO_ROOT / "docs" / "results" / "ladder" / "runs"
    if not (SHARED_DATA / "multi30k" / "test_2016_flickr.de.gz").is_file():
        pytest.skip(f"Multi30k not found under {SHARED_DATA}")
    for seed in (1, 2):
        branch = shutil.copytree(ladder / f"step5_gqa_seed{seed}", tmp_path / "branches" / f"step5_qk_norm_seed{seed}")
        shutil.copy(ladder / f"step4_rope_seed{seed}" / "hyps" / "test_2016_flickr.txt", branch / "hyps")
        as_branch(branch, "step5_qk_norm", qk_norm="rmsnorm")
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "compare.py"),
            str(ladder / "step5_gqa_seed1"),
            str(ladder / "step5_gqa_seed2"),
            str(tmp_path / "branches"),
            "--out",
            str(out),
            "--bootstrap",
            "50",
            "--no-prev",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRANSFORMER_DATA_DIR": str(SHARED_DATA)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "| step5_gqa (baseline) | 2/2 |" in proc.stdout and "| step5_qk_norm | 2/2 |" in proc.stdout
    assert "Δ prev" not in proc.stdout and "Differs in" not in proc.stdout and "trained differently" not in proc.stdout
    assert "## BLEU by reference length" in proc.stdout
    assert "--length-buckets): 1-10, 11-15, 16-20, 21-30, 31+. Test sentences: `test_2016_flickr`" in proc.stdout
    rows = list(csv.DictReader((out / "length_buckets.csv").open()))
    assert [r["label"] for r in rows] == ["step5_gqa"] * 5 + ["step5_qk_norm"] * 5
    refs = [
        line
        for line in gzip.open(SHARED_DATA / "multi30k" / "test_2016_flickr.de.gz", "rt", encoding="utf-8")
        .read()
        .splitlines()
    ]
    assert sum(int(r["n_sentences"]) for r in rows[:5]) == len(refs) == 1000
    short = [i for i, r in enumerate(refs) if 1 <= len(r.split()) <= 10]
    assert int(rows[5]["n_sentences"]) == len(short)
    bleus = []
    for seed in (1, 2):
        hyps = (ladder / f"step4_rope_seed{seed}" / "hyps" / "test_2016_flickr.txt").read_text(encoding="utf-8")
        hyps = hyps.splitlines()
        bleus.append(sacrebleu.corpus_bleu([hyps[i] for i in short], [[refs[i] for i in short]]).score)
    assert float(rows[5]["bleu_mean"]) == pytest.approx(sum(bleus) / 2)
    assert float(rows[5]["bleu_ci_low"]) < float(rows[5]["bleu_mean"]) < float(rows[5]["bleu_ci_high"])
    assert rows[5]["delta_bleu_ci_low"] != "" and (out / "bleu_by_length.png").stat().st_size > 5000
