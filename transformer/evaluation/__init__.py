"""Evaluation: sacreBLEU BLEU/chrF with signatures and paired bootstrap resampling (:mod:`.metrics`).

:mod:`.command` is the work of ``scripts/evaluate.py`` (a run's test-split scores, hypothesis files'
scores and bootstrap); it loads models through :mod:`transformer.generation`, so this package does
not import it: ``from transformer.evaluation.command import evaluate``.
"""

from transformer.evaluation.metrics import corpus_scores, paired_bootstrap

__all__ = ["corpus_scores", "paired_bootstrap"]
