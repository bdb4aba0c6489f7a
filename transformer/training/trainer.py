"""Moved: the Trainer is :mod:`transformer.training.loop.trainer` (issue 45).

This module keeps ``from transformer.training.trainer import Trainer`` working for code written
before the move; new code imports from :mod:`transformer.training.loop.trainer`.
"""

from transformer.training.loop.trainer import Trainer, TrainingError

__all__ = ["Trainer", "TrainingError"]
