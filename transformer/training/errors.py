"""The error a training run stops with when it cannot go on (raised by the trainer, its validation
and the run around it; ``scripts/train.py`` prints it as one line)."""

__all__ = ["TrainingError"]


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss, a resume that does not fit)."""
