"""Moved: one training run, ``train(cfg)``, is :mod:`transformer.training.job.training_run` (issue 45).

This module keeps ``from transformer.training.run import train`` working for code written before
the move; new code imports from :mod:`transformer.training.job.training_run`.
"""

from transformer.training.job.training_run import train

__all__ = ["train"]
