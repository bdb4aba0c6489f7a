"""Branch studies in compare_sweeps: runs of another study (``experiment_name``) off the ladder share its
table, and ``compare_prev=False`` (``--no-prev``) tests each branch against the baseline only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.analysis.test_compare import _degrade, _refs, corpus, make_run  # noqa: F401 (fixtures)
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
    as_branch(make_run(tmp_path / "branches" / "step5_qk_norm_seed1", corpus, "step5_qk_norm", 1, refs, bleu=42.0),
              qk_norm="rmsnorm")
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
    as_branch(make_run(tmp_path / "s" / "1", corpus, "step5_mla", 1, _degrade(refs, 0.05, 1), bleu=20.0),
              kv_lora_rank=16)
    as_branch(make_run(tmp_path / "s" / "2", corpus, "step5_qk_norm", 1, _degrade(refs, 0.5, 1), bleu=30.0),
              qk_norm="rmsnorm")
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

