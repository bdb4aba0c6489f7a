"""transformer.analysis.length by value: buckets of reference length, per-bucket sacreBLEU scores on hand-made
hypotheses, paired bootstrap intervals, pooled test splits, and the outputs of scripts/compare.py."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from tests.analysis.test_compare import make_run
from tests.conftest import REPO_ROOT
from transformer.analysis import (
    Bucket,
    compare_sweeps,
    length_markdown,
    parse_buckets,
    stats,
    to_markdown,
    write_outputs,
)
from transformer.analysis.length import _scores, bucket_indices, reference_length
from transformer.evaluation.metrics import scorers

WORDS = "ein mann eine frau hund spielt im park auf der straße mit einem ball und kind".split()
LENGTHS = [3, 5, 7, 8, 10, 10, 11, 12, 13, 15, 15, 16, 18, 19, 20, 21, 25, 30, 31, 40]
"""Reference lengths in words: 6 in 1-10, 5 in 11-15, 4 in 16-20, 3 in 21-30, 2 in 31+."""


def _sentence(n: int, k: int) -> str:
    return " ".join(WORDS[(k * 7 + i * 3 + i * i) % len(WORDS)] for i in range(n))


def _write_split(root: Path, name: str, refs: list[str]) -> None:
    (root / f"{name}.de").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    (root / f"{name}.en").write_text("".join(f"source {i}\n" for i in range(len(refs))), encoding="utf-8")


@pytest.fixture()
def corpus(tmp_path) -> Path:
    """A parallel_text corpus: split ``test`` with the references of :data:`LENGTHS`, ``test2`` with 4 more."""
    root = tmp_path / "corpus"
    root.mkdir()
    _write_split(root, "test", [_sentence(n, k) for k, n in enumerate(LENGTHS)])
    _write_split(root, "test2", [_sentence(n, 50 + k) for k, n in enumerate([4, 12, 12, 33])])
    return root


def _refs(corpus: Path, split: str = "test") -> list[str]:
    return (corpus / f"{split}.de").read_text(encoding="utf-8").splitlines()


def _drop_last(refs: list[str], n: int = 3) -> list[str]:
    return [" ".join(r.split()[:-n]) for r in refs]


def _hyps_a(refs: list[str], seed: int) -> list[str]:
    """Perfect in 1-10, seed-dependent damage in 11-15, empty in 16-20, garbage in 21-30, and in 31+ the
    baseline's hypotheses (:func:`_hyps_base`)."""
    out = []
    for r in refs:
        n = reference_length(r)
        if n <= 10:
            out.append(r)
        elif n >= 31:
            out.append(" ".join(r.split()[:-3]))
        elif n <= 15:
            out.append(" ".join(r.split()[:-3]) if seed == 1 else " ".join(r.split()[1:]))
        elif n <= 20:
            out.append("")
        else:
            out.append("xyzzy plugh")
    return out


def _hyps_base(refs: list[str]) -> list[str]:
    """Every sentence's last three words dropped."""
    return _drop_last(refs)


def _with_split(run_dir: Path, split: str, hyps: list[str]) -> Path:
    """Add test split ``split`` to a run made by make_run: its hypotheses, score entry and config."""
    (run_dir / "hyps" / f"{split}.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    res = json.loads((run_dir / "results.json").read_text())
    res["config"]["data"]["test_splits"] = ["test", split]
    res["test"] = {"test": {"bleu": res["bleu"]}, split: {"bleu": 1.0}}
    (run_dir / "results.json").write_text(json.dumps(res))
    return run_dir


@pytest.fixture()
def sweep(tmp_path, corpus) -> Path:
    """step0 (baseline, :func:`_hyps_base`) and step1 (:func:`_hyps_a`), seeds 1 and 2, each with ``test2``
    hypotheses (step1: perfect; step0: last three words dropped)."""
    refs, refs2 = _refs(corpus), _refs(corpus, "test2")
    for seed in (1, 2):
        base = make_run(
            tmp_path / "s" / f"step0_seed{seed}", corpus, "step0_vaswani2017", seed, _hyps_base(refs), bleu=20.0
        )
        _with_split(base, "test2", _drop_last(refs2))
        a = make_run(tmp_path / "s" / f"step1_seed{seed}", corpus, "step1_pre_ln", seed, _hyps_a(refs, seed), bleu=30.0)
        _with_split(a, "test2", refs2)
    return tmp_path / "s"


def _bleu(hyps: list[str], refs: list[str], idx: list[int]) -> float:
    """sacreBLEU's corpus BLEU of the sentences ``idx``, computed directly."""
    return sacrebleu.corpus_bleu([hyps[i] for i in idx], [[refs[i] for i in idx]]).score


def _chrf(hyps: list[str], refs: list[str], idx: list[int]) -> float:
    return sacrebleu.corpus_chrf([hyps[i] for i in idx], [[refs[i] for i in idx]]).score


def _cells(comp, label: str) -> dict[str, dict]:
    return {r["bucket"]: r for r in comp.length.rows if r["label"] == label}


# ----------------------------------------------------------------------------- buckets


def test_buckets_parse_and_are_checked_with_one_line_errors():
    assert [b.label for b in parse_buckets("1-10,11-15,16-20,21-30,31+")] == ["1-10", "11-15", "16-20", "21-30", "31+"]
    assert parse_buckets(" 1-5 , 6 , 8+ ") == [Bucket(1, 5), Bucket(6, 6), Bucket(8, None)]  # a gap at 7
    assert parse_buckets([Bucket(1, 10), Bucket(11)]) == [Bucket(1, 10), Bucket(11, None)]
    for spec, why in (
        ("1-10,5-15", "5-15 starts at or below 10, where 1-10 ends"),
        ("11-15,1-10", "1-10 starts at or below 15, where 11-15 ends"),
        ("1-10,10-20", "10-20 starts at or below 10"),
        ("15-11", "15-11 ends before it starts"),
        ("1-10,11+,20-30", "11+ has no upper end, so it must be the last bucket"),
        ("1-10,short", "'short' is not LOW-HIGH, LOW+ or N words"),
        ("", "no bucket given"),
    ):
        with pytest.raises(ValueError, match="^length buckets ") as err:
            parse_buckets(spec)
        assert why in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_sentence_falls_in_the_bucket_of_its_reference_length_in_words_edges_included():
    buckets = parse_buckets("1-10,11-15,16-20,21-30,31+")
    lengths = [1, 10, 11, 15, 16, 20, 21, 30, 31, 200]
    refs = [" ".join(["w"] * n) for n in lengths] + [""]  # a reference of 0 words: in no bucket
    assert bucket_indices(refs, buckets) == ([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]], 1)
    assert reference_length("Ein  Mann,\tder\nläuft.") == 4  # whitespace tokens, punctuation attached
    assert bucket_indices(["a b", "a b c", "a b c d"], parse_buckets("1-2,4+")) == ([[0], [2]], 1)  # the gap


# ----------------------------------------------------------------------------- scores by value


def test_bucket_scores_are_sacrebleus_on_the_bucket_mean_over_seeds(sweep, corpus):
    comp = compare_sweeps([sweep], n_bootstrap=0)
    table, refs = comp.length, _refs(corpus)
    (short, mid, _, _, longest), outside = bucket_indices(refs, table.buckets)
    assert table.splits == ["test"] and table.n_sentences == [6, 5, 4, 3, 2] and outside == table.n_outside == 0
    a, base = _cells(comp, "step1_pre_ln"), _cells(comp, "step0_vaswani2017")
    assert a["1-10"]["bleu_mean"] == pytest.approx(100.0)
    assert a["31+"]["bleu_mean"] == base["31+"]["bleu_mean"] == pytest.approx(_bleu(_hyps_base(refs), refs, longest))
    assert a["16-20"]["bleu_mean"] == 0.0 and a["16-20"]["chrf_mean"] == 0.0  # empty hypotheses
    assert a["21-30"]["bleu_mean"] == 0.0  # garbage
    seeds = [_bleu(_hyps_a(refs, s), refs, mid) for s in (1, 2)]
    assert 0 < seeds[0] != seeds[1] < 100
    assert a["11-15"]["bleu_mean"] == pytest.approx(sum(seeds) / 2)
    assert a["11-15"]["bleu_seeds"] == f"1:{seeds[0]:.2f} 2:{seeds[1]:.2f}"
    assert a["11-15"]["chrf_mean"] == pytest.approx(sum(_chrf(_hyps_a(refs, s), refs, mid) for s in (1, 2)) / 2)
    assert base["1-10"]["bleu_mean"] == pytest.approx(_bleu(_hyps_base(refs), refs, short))
    assert a["1-10"]["delta_bleu"] == pytest.approx(100.0 - _bleu(_hyps_base(refs), refs, short))
    assert a["31+"]["delta_bleu"] == 0.0 and base["1-10"]["delta_bleu"] is None
    assert a["1-10"]["bleu_ci_low"] is None and a["1-10"]["n_runs"] == 2 and a["1-10"]["seeds"] == "1 2"
    assert table.signatures["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_by_source_length_a_sentence_falls_in_the_bucket_of_its_source(sweep, corpus):
    """The same scores, bucketed by the source's length in words (what a model is given); sources
    the data does not hold leave the table empty, saying why."""
    srcs = [_sentence(n, 90 + k) for k, n in enumerate([2] * 10 + [12] * 5 + [25] * 5)]
    (corpus / "test.en").write_text("".join(x + "\n" for x in srcs), encoding="utf-8")
    comp = compare_sweeps([sweep], n_bootstrap=0)
    table, refs = comp.source_length, _refs(corpus)
    indices, outside = bucket_indices(srcs, table.buckets)
    assert table.by == "source" and table.n_sentences == [10, 5, 0, 5, 0] and outside == 0
    assert comp.length.n_sentences == [6, 5, 4, 3, 2]  # by reference, as before
    cells = {r["bucket"]: r for r in table.rows if r["label"] == "step1_pre_ln"}
    for bucket, idx in zip(("1-10", "11-15", "21-30"), (indices[0], indices[1], indices[3])):
        expected = sum(_bleu(_hyps_a(refs, s), refs, idx) for s in (1, 2)) / 2
        assert cells[bucket]["bleu_mean"] == pytest.approx(expected), bucket
    md = to_markdown(comp)
    assert "## BLEU by reference length" in md and "## BLEU by source length" in md
    assert "Buckets of source length in words (whitespace-separated tokens of the detokenized source;" in md
    for hyps in sweep.glob("*/hyps/test.txt"):  # the references travel with the runs, the sources do not
        hyps.with_suffix(".ref").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    (corpus / "test.en").unlink()
    stats._SPLIT_CACHE.clear()  # what this process read of the data
    gone = compare_sweeps([sweep], n_bootstrap=0).source_length
    assert gone.rows == [] and any("the sources of test are neither" in n for n in gone.notes), gone.notes


def test_intervals_resample_the_buckets_sentences_alike_for_every_configuration(sweep, corpus):
    comp = compare_sweeps([sweep], n_bootstrap=200, bootstrap_seed=7)
    a, base = _cells(comp, "step1_pre_ln"), _cells(comp, "step0_vaswani2017")
    assert (a["1-10"]["bleu_ci_low"], a["1-10"]["bleu_ci_high"]) == pytest.approx((100.0, 100.0))  # every resample
    assert (a["16-20"]["bleu_ci_low"], a["16-20"]["bleu_ci_high"]) == (0.0, 0.0)
    # 31+: both configurations have the same hypotheses there: their scores vary over the resamples, but
    # resampled alike (paired) they never differ
    assert a["31+"]["bleu_ci_low"] < a["31+"]["bleu_ci_high"]
    assert (a["31+"]["delta_bleu_ci_low"], a["31+"]["delta_bleu_ci_high"]) == pytest.approx((0.0, 0.0), abs=1e-9)
    for cell in (a["11-15"], base["1-10"], base["11-15"]):
        assert cell["bleu_ci_low"] < cell["bleu_mean"] < cell["bleu_ci_high"]
        assert cell["chrf_ci_low"] < cell["chrf_mean"] < cell["chrf_ci_high"]
    assert a["1-10"]["delta_bleu_ci_low"] > 0  # step1 is perfect where step0 drops words: the interval excludes 0
    again = compare_sweeps([sweep], n_bootstrap=200, bootstrap_seed=7)
    assert again.length.rows == comp.length.rows  # the seed fixes the resamples


def test_the_change_with_length_is_each_buckets_bleu_minus_the_first_and_is_compared_with_the_baselines(sweep):
    comp = compare_sweeps([sweep], n_bootstrap=0)
    a, base = _cells(comp, "step1_pre_ln"), _cells(comp, "step0_vaswani2017")
    for cells in (a, base):
        assert cells["1-10"]["change_bleu"] is None  # the first bucket is the reference
        for bucket in ("11-15", "16-20", "21-30", "31+"):
            assert cells[bucket]["change_bleu"] == pytest.approx(
                cells[bucket]["bleu_mean"] - cells["1-10"]["bleu_mean"]
            )
    assert base["31+"]["delta_change_bleu"] is None and a["1-10"]["delta_change_bleu"] is None
    assert a["11-15"]["delta_change_bleu"] == pytest.approx(a["11-15"]["change_bleu"] - base["11-15"]["change_bleu"])
    # 31+: both have the same hypotheses there, so step1 "loses more with length" by exactly its lead on 1-10
    assert a["31+"]["delta_change_bleu"] == pytest.approx(-a["1-10"]["delta_bleu"])
    with_ci = compare_sweeps([sweep], n_bootstrap=200, bootstrap_seed=7)
    a, base = _cells(with_ci, "step1_pre_ln"), _cells(with_ci, "step0_vaswani2017")
    # step1's 1-10 bucket scores 100 in every resample, so its change is its bucket's resampled BLEU minus 100
    assert (a["11-15"]["change_bleu_ci_low"], a["11-15"]["change_bleu_ci_high"]) == pytest.approx(
        (a["11-15"]["bleu_ci_low"] - 100.0, a["11-15"]["bleu_ci_high"] - 100.0)
    )
    # and paired against the baseline's change over the same resamples: on 31+ it mirrors the 1-10 difference
    assert (a["31+"]["delta_change_bleu_ci_low"], a["31+"]["delta_change_bleu_ci_high"]) == pytest.approx(
        (-a["1-10"]["delta_bleu_ci_high"], -a["1-10"]["delta_bleu_ci_low"])
    )
    assert base["16-20"]["change_bleu_ci_low"] < base["16-20"]["change_bleu"] < base["16-20"]["change_bleu_ci_high"]


def test_the_change_with_length_starts_at_the_first_bucket_that_holds_sentences(sweep, tmp_path):
    comp = compare_sweeps([sweep], n_bootstrap=0, length_buckets="1-10,11-20,21+")
    assert comp.length.reference == 0
    empty_first = compare_sweeps([sweep], n_bootstrap=0, length_buckets="0-0,1-10,11-20,21+")
    assert empty_first.length.n_sentences[0] == 0 and empty_first.length.reference == 1
    a = _cells(empty_first, "step1_pre_ln")
    assert a["0"]["change_bleu"] is None and a["1-10"]["change_bleu"] is None
    assert a["11-20"]["change_bleu"] == pytest.approx(a["11-20"]["bleu_mean"] - a["1-10"]["bleu_mean"])
    md = write_outputs(empty_first, tmp_path / "out", plots=False)["markdown"].read_text()
    assert "BLEU change from the shortest bucket with sentences (1-10)" in md
    assert "| step1_pre_ln |  | reference |" in md and "resampled" not in md.split("Corpus BLEU")[1]  # no bootstrap
    one = compare_sweeps([sweep], n_bootstrap=0, length_buckets="1-10,50+")  # one bucket with sentences
    assert one.length.reference is None and all(r["change_bleu"] is None for r in one.length.rows)
    assert "BLEU change" not in write_outputs(one, tmp_path / "one", plots=False)["markdown"].read_text()


def test_a_resamples_score_is_sacrebleus_on_the_resampled_sentences(corpus):
    refs = _refs(corpus)
    hyps = _hyps_a(refs, 2)
    idx = [6, 7, 8, 9, 10]  # the 11-15 bucket
    draws = [7, 7, 10, 6, 7]  # one resample with replacement
    counts = np.array([[float(draws.count(i)) for i in idx], [1.0] * len(idx)])  # and the identity resample
    metrics = scorers("13a", False)
    out = _scores([hyps], refs, [idx], [counts], metrics)
    ((seeds, values),) = out["bleu"]
    assert seeds == [pytest.approx(_bleu(hyps, refs, idx))]
    assert values[0] == pytest.approx(_bleu(hyps, refs, draws)) and values[1] == pytest.approx(seeds[0])
    ((_, chrf_values),) = out["chrf"]
    assert chrf_values[0] == pytest.approx(_chrf(hyps, refs, draws))


# ----------------------------------------------------------------------------- test splits


def test_splits_are_pooled_by_concatenating_their_sentences(sweep, corpus):
    refs = _refs(corpus) + _refs(corpus, "test2")
    pooled = compare_sweeps([sweep], n_bootstrap=0, length_splits="all")
    assert pooled.length.splits == ["test", "test2"] and pooled.length.n_sentences == [7, 7, 4, 3, 3]
    base_hyps = _hyps_base(_refs(corpus)) + _drop_last(_refs(corpus, "test2"))
    short = bucket_indices(refs, pooled.length.buckets)[0][0]
    assert _cells(pooled, "step0_vaswani2017")["1-10"]["bleu_mean"] == pytest.approx(_bleu(base_hyps, refs, short))
    assert "Test sentences: `test`, `test2` pooled (24 sentences)." in "\n".join(length_markdown(pooled.length))
    pytest.importorskip("matplotlib")
    from transformer.analysis.plots import bleu_by_length_figure

    (ax,) = bleu_by_length_figure(pooled).axes  # the pooled splits are named in the title, not the axis
    assert ax.get_ylabel() == "test BLEU (2 test sets pooled)" and "\ntest, test2\n" in ax.get_title()
    (ax,) = bleu_by_length_figure(compare_sweeps([sweep], n_bootstrap=0, length_splits="test2")).axes
    assert ax.get_ylabel() == "test BLEU (test2)"
    only2 = compare_sweeps([sweep], n_bootstrap=0, length_splits="test2")
    assert only2.length.splits == ["test2"] and only2.length.n_sentences == [1, 2, 0, 0, 1]
    assert _cells(only2, "step1_pre_ln")["11-15"]["bleu_mean"] == pytest.approx(100.0)
    assert _cells(only2, "step1_pre_ln")["16-20"]["bleu_mean"] is None  # no sentence there
    with pytest.raises(ValueError, match="no run has hypotheses for test3; the runs' test splits: test, test2"):
        compare_sweeps([sweep], n_bootstrap=0, length_splits="test2,test3")
    with pytest.raises(ValueError, match="'all' pools every test split"):
        compare_sweeps([sweep], n_bootstrap=0, length_splits="all,test")


def test_a_split_some_runs_lack_is_not_pooled_with_all_and_leaves_them_out_when_named(sweep):
    (sweep / "step1_seed2" / "hyps" / "test2.txt").unlink()
    pooled = compare_sweeps([sweep], n_bootstrap=0, length_splits="all")
    assert pooled.length.splits == ["test"] and pooled.length.notes == [
        "test splits not scored by every run, not pooled: test2"
    ]
    named = compare_sweeps([sweep], n_bootstrap=0, length_splits="test2")
    assert _cells(named, "step1_pre_ln")["1-10"]["seeds"] == "1"
    assert any("step1_seed2: left out of the length table (no hypotheses of test2)" in n for n in named.length.notes)


# ----------------------------------------------------------------------------- outputs


def test_outputs_have_the_length_section_csv_and_plot(sweep, tmp_path):
    comp = compare_sweeps([sweep], n_bootstrap=50, length_buckets="1-10,11-20,21+")
    paths = write_outputs(comp, tmp_path / "out")
    md = paths["markdown"].read_text()
    assert "## BLEU by reference length" in md
    assert (
        "Buckets of reference length in words (whitespace-separated tokens of the detokenized reference; "
        "--length-buckets): 1-10, 11-20, 21+. Test sentences: `test` (20 sentences)."
    ) in md
    assert "| Configuration | 1-10 (n=6) | 11-20 (n=9) | 21+ (n=5) |" in md
    assert "| step1_pre_ln | 100.00 [100.00, 100.00] |" in md
    assert md.count("## BLEU by reference length") == 1 and "![bleu_by_length](bleu_by_length.png)" in md
    assert (
        "BLEU change from the shortest bucket with sentences (1-10), how BLEU falls with length [95% interval]:" in md
    )
    assert (
        "That change against the baseline's (+: loses less with length than the baseline) [paired 95% interval]:" in md
    )
    rows = list(csv.DictReader(paths["length_csv"].open()))
    assert rows[4]["change_bleu"] != "" and rows[3]["change_bleu"] == "" and rows[1]["delta_change_bleu"] == ""
    assert [(r["label"], r["bucket"], r["n_sentences"]) for r in rows] == [
        ("step0_vaswani2017", "1-10", "6"),
        ("step0_vaswani2017", "11-20", "9"),
        ("step0_vaswani2017", "21+", "5"),
        ("step1_pre_ln", "1-10", "6"),
        ("step1_pre_ln", "11-20", "9"),
        ("step1_pre_ln", "21+", "5"),
    ]
    assert rows[5]["max_words"] == "" and rows[3]["delta_bleu"] != "" and rows[0]["delta_bleu"] == ""
    assert paths["bleu_by_length"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert compare_sweeps([sweep], n_bootstrap=0, length_buckets=None).length is None


def test_the_cli_refuses_bad_buckets_with_one_line(sweep, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "compare.py"),
            str(sweep),
            "--out",
            str(tmp_path / "out"),
            "--bootstrap",
            "0",
            "--length-buckets",
            "1-10,5-15",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.startswith("error: length buckets '1-10,5-15': 5-15 starts at or below 10")
        and len(proc.stderr.strip().splitlines()) == 1
    )
