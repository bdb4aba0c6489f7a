"""Corpus BLEU (Papineni et al. 2002) and chrF (Popović 2015) by sacreBLEU (Post 2018) with their
signatures, and sacreBLEU's paired bootstrap resampling (Koehn 2004; Moses'
``bootstrap-hypothesis-difference-significance.pl``). ``tokenize="none"`` is for the pre-tokenized
``multi30k_tok_*`` corpora (multi-bleu style), with sacreBLEU's "forgot to detokenize" warning off."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence

from sacrebleu.metrics import BLEU, CHRF

__all__ = ["corpus_scores", "paired_bootstrap", "scorers"]


def _bleu(tokenize: str, lowercase: bool) -> BLEU:
    """sacreBLEU's BLEU; ``tokenize="none"`` declares pre-tokenized text, so its warning is off."""
    return BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenize == "none")


def scorers(tokenize: str = "13a", lowercase: bool = False) -> dict[str, BLEU | CHRF]:
    """``{"bleu": BLEU, "chrf": CHRF}``, new sacreBLEU metrics as :func:`corpus_scores` uses them
    (``.corpus_score(hyps, [refs]).score`` in 0-100)."""
    return {"bleu": _bleu(tokenize, lowercase), "chrf": CHRF(lowercase=lowercase)}


def _check(hyps: Sequence[str], refs: Sequence[str], what: str = "hypotheses") -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} {what} but {len(refs)} references: the lines must pair up")
    if not refs:
        raise ValueError("no references: nothing to score")


def corpus_scores(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a", lowercase: bool = False) -> dict:
    """Corpus BLEU and chrF of detokenised hypotheses against one reference each.

    Returns:
        ``{"bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_details"}``: scores in 0-100, and
        sacreBLEU's one-line summary with the n-gram precisions and brevity penalty.

    Raises:
        ValueError: the lists differ in length or are empty.
    """
    _check(hyps, refs)
    hyps, refs_t = list(hyps), [list(refs)]
    bleu, chrf = scorers(tokenize, lowercase).values()
    b = bleu.corpus_score(hyps, refs_t)
    c = chrf.corpus_score(hyps, refs_t)
    return {
        "bleu": float(b.score),
        "chrf": float(c.score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_details": str(b),
    }


@contextlib.contextmanager
def _sacrebleu_seed(seed: int | None) -> Iterator[None]:
    """sacreBLEU reads the resampling seed from ``SACREBLEU_SEED`` when a test is set up."""
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = "None" if seed is None else str(int(seed))
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def paired_bootstrap(
    baseline_hyps: Sequence[str],
    system_hyps: Mapping[str, Sequence[str]],
    refs: Sequence[str],
    n_samples: int = 1000,
    seed: int | None = 12345,
    tokenize: str = "13a",
    lowercase: bool = False,
) -> dict[str, dict]:
    """Paired bootstrap resampling (Koehn 2004) of BLEU and chrF, each system against a baseline.

    The p-value is sacreBLEU's two-sided one: the probability, under resampling centred at no
    difference, of a difference at least as large as observed.

    Returns:
        ``{name: {"bleu", "bleu_p_value", "bleu_mean", "bleu_ci", "chrf", "chrf_p_value", "chrf_mean",
        "chrf_ci", "p_value", "signatures"}}``, ``"baseline"`` first (p-values None); ``p_value`` is
        BLEU's.

    Raises:
        ValueError: mismatched lengths, no systems, or a system named ``baseline``.
    """
    from sacrebleu.significance import PairedTest

    _check(baseline_hyps, refs, "baseline hypotheses")
    if not system_hyps:
        raise ValueError("paired_bootstrap needs at least one system besides the baseline")
    for name, hyps in system_hyps.items():
        if name == "baseline":
            raise ValueError(f"system name {name!r} is reserved")
        _check(hyps, refs, f"hypotheses of {name!r}")
    named = [("baseline", list(baseline_hyps))] + [(k, list(v)) for k, v in system_hyps.items()]
    metrics = {"BLEU": _bleu(tokenize, lowercase), "chrF2": CHRF(lowercase=lowercase)}
    with _sacrebleu_seed(seed):
        test = PairedTest(named, metrics, [list(refs)], test_type="bs", n_samples=n_samples)
        signatures, scores = test()
    keys = {"BLEU": "bleu", "chrF2": "chrf"}
    out: dict[str, dict] = {}
    for row, name in enumerate(scores["System"]):
        entry: dict = {}
        for metric, key in keys.items():
            res = scores[metric][row]
            entry[key] = float(res.score)
            entry[f"{key}_p_value"] = None if res.p_value is None else float(res.p_value)
            entry[f"{key}_mean"] = None if res.mean is None else float(res.mean)
            entry[f"{key}_ci"] = None if res.ci is None else float(res.ci)
        entry["p_value"] = entry["bleu_p_value"]
        entry["signatures"] = {keys[m]: str(sig) for m, sig in signatures.items()}
        out[name] = entry
    return out
