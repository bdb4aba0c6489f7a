"""sacreBLEU BLEU/chrF with signatures and paired bootstrap (transformer.evaluation.metrics)."""

from __future__ import annotations

import random

import pytest
import sacrebleu

from transformer.evaluation import corpus_scores, paired_bootstrap

REFS = [
    "Two young, White males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two men are at the stove preparing food.",
] * 8


def shuffle_words(lines: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        rng.shuffle(words)
        out.append(" ".join(words))
    return out


def test_identical_hypotheses_score_100() -> None:
    s = corpus_scores(REFS, REFS)
    assert s["bleu"] == pytest.approx(100.0)
    assert s["chrf"] == pytest.approx(100.0)
    assert "tok:13a" in s["bleu_signature"] and "nrefs:1" in s["bleu_signature"]
    assert "nc:6" in s["chrf_signature"]


def test_scores_match_sacrebleu_and_tokenize_none() -> None:
    hyps = shuffle_words(REFS, 0)
    s = corpus_scores(hyps, REFS)
    assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [REFS]).score)
    assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [REFS]).score)
    tok = corpus_scores(["a man , smiling ."], ["a man, smiling."], tokenize="none")
    assert "tok:none" in tok["bleu_signature"] and tok["bleu"] < 100
    assert corpus_scores(["a man , smiling ."], ["a man, smiling."])["bleu"] == pytest.approx(100.0)
    lc = corpus_scores([r.lower() for r in REFS], REFS, lowercase=True)
    assert lc["bleu"] == pytest.approx(100.0) and "case:lc" in lc["bleu_signature"]
    with pytest.raises(ValueError, match="pair up"):
        corpus_scores(REFS[:3], REFS)


def test_paired_bootstrap() -> None:
    baseline = shuffle_words(REFS, 1)
    better = list(REFS)
    close = list(baseline)
    close[0] = REFS[0]  # one sentence fixed
    out = paired_bootstrap(baseline, {"better": better, "close": close}, REFS, n_samples=200)
    assert list(out) == ["baseline", "better", "close"]
    assert out["baseline"]["p_value"] is None
    assert out["better"]["bleu"] == pytest.approx(100.0)
    assert out["better"]["p_value"] < 0.01 and out["better"]["chrf_p_value"] < 0.01
    assert out["close"]["p_value"] > 0.05
    assert "bs:200" in out["better"]["signatures"]["bleu"] and "seed:12345" in out["better"]["signatures"]["bleu"]
    again = paired_bootstrap(baseline, {"better": better, "close": close}, REFS, n_samples=200)
    assert again == out  # seeded
    with pytest.raises(ValueError, match="reserved"):
        paired_bootstrap(baseline, {"baseline": better}, REFS)
    with pytest.raises(ValueError, match="pair up"):
        paired_bootstrap(baseline, {"x": better[:2]}, REFS)


def test_tokenize_none_does_not_warn_about_tokenized_text(caplog: pytest.LogCaptureFixture) -> None:
    # 100+ lines ending in " ." make sacreBLEU warn "forgot to detokenize" unless told the text
    # is tokenized on purpose (tokenize="none"); the score must be unchanged by that.
    refs = ["a man , smiling ." for _ in range(120)]
    hyps = ["a man smiling ." for _ in range(120)]
    with caplog.at_level("WARNING", logger="sacrebleu"):
        s = corpus_scores(hyps, refs, tokenize="none")
        paired_bootstrap(hyps, {"same": refs}, refs, n_samples=10, tokenize="none")
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]
    plain = sacrebleu.metrics.BLEU(tokenize="none")
    assert s["bleu"] == pytest.approx(plain.corpus_score(hyps, [refs]).score)
    assert s["bleu_signature"] == str(plain.get_signature())
    caplog.clear()
    with caplog.at_level("WARNING", logger="sacrebleu"):
        corpus_scores(hyps, refs)  # 13a: the text should be detokenized, so the warning stays
    assert [r for r in caplog.records if "detokenize" in r.getMessage()]
