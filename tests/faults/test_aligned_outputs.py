"""Outputs stay line-aligned with the inputs (empty in, empty out) and BLEU covers
every line, in training (validation/test), evaluate.py and translate.py."""

from __future__ import annotations

import json

from tests.faults.conftest import EMPTY_TEST_LINE, EMPTY_VALID_LINE, SIZES, load_script, script_config, small_config


def test_evaluation_splits_keep_empty_lines_training_drops_them(gappy_corpus, tmp_path):
    from transformer.data.dataset import load_translation_data

    cfg = small_config(gappy_corpus, tmp_path / "run")
    data = load_translation_data(cfg.data, log=None)
    test, valid = data.splits["test_2016_flickr"], data.splits["valid"]
    assert len(test) == SIZES["test_2016_flickr"] and len(valid) == SIZES["val"]
    assert test.src_text[EMPTY_TEST_LINE] == "" and test.src[EMPTY_TEST_LINE] == []
    assert valid.src_text[EMPTY_VALID_LINE] == "" and data.stats["dropped_empty"]["valid"] == 0
    assert len(data.splits["train"]) == SIZES["train"]  # the training slice has no empty line


def test_training_test_hypotheses_have_one_line_per_source_line(trained_run, gappy_corpus):
    hyps = (trained_run / "hyps" / "test_2016_flickr.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == SIZES["test_2016_flickr"]
    assert hyps[EMPTY_TEST_LINE] == ""
    refs = (gappy_corpus / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    from transformer.evaluation import corpus_scores

    results = json.loads((trained_run / "results.json").read_text())
    assert results["bleu"] == corpus_scores(hyps, refs)["bleu"]  # BLEU over every line


def test_evaluate_checkpoint_scores_every_line(trained_run, gappy_corpus):
    load_script("evaluate").run(
        script_config(
            "evaluate",
            f"checkpoint={trained_run}",
            "splits=[test_2016_flickr]",
            f"data.root={gappy_corpus}",
            "progress=false",
        )
    )
    out = trained_run / "eval" / "checkpoint_best"
    hyps = (out / "test_2016_flickr.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == SIZES["test_2016_flickr"] and hyps[EMPTY_TEST_LINE] == ""
    saved = json.loads((out / "results.json").read_text())["splits"]["test_2016_flickr"]
    assert saved["sentences"] == SIZES["test_2016_flickr"] and saved["empty_sources"] == 1
