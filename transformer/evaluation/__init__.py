"""Evaluation: sacreBLEU BLEU/chrF with signatures and paired bootstrap resampling."""

from transformer.evaluation.metrics import corpus_scores, paired_bootstrap

__all__ = ["corpus_scores", "paired_bootstrap"]
