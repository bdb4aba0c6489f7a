"""Moved: the work of ``scripts/evaluate.py`` is :mod:`transformer.evaluation.command` (issue 45).

This module keeps ``from transformer.evaluation.run import evaluate`` working for code written
before the move; new code imports from :mod:`transformer.evaluation.command`.
"""

from transformer.evaluation.command import evaluate, evaluate_checkpoint, score_files

__all__ = ["evaluate", "evaluate_checkpoint", "score_files"]
