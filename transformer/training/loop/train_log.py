"""The training metrics logged every ``train.log_every`` updates, and what the progress bar shows."""

from __future__ import annotations

from typing import Any

from transformer.training.step.criterion import perplexity
from transformer.training.step.update_stats import read_stats

__all__ = ["TrainLog"]


class TrainLog:
    """Target tokens since the last logged update and the training seconds at it, so that a logged
    update reports tokens per second over its window; the host reads the device only in :meth:`write`.

    Args:
        logger: a :class:`~transformer.training.monitoring.loggers.MetricsLogger`.
        train_time: the run's training seconds when logging starts (a resume's).
    """

    def __init__(self, logger: Any, train_time: float) -> None:
        self.logger = logger
        self.window_tokens: Any = 0  # an int, or a device tensor off the eager CPU path
        self.logged_time = train_time
        self.shown = {"loss": "-", "tok_s": "-"}  # the last logged loss and tokens/s, for the bar

    def add(self, stats: dict[str, Any]) -> None:
        """Count an update's target tokens (``Trainer.train_step``'s statistics) into the window."""
        self.window_tokens = self.window_tokens + stats["ntokens"]

    def write(self, stats: dict[str, Any], update: int, epoch: int, train_time: float) -> None:
        """Log the update's statistics (one host read) with the window's tokens per second, then
        start a new window at ``train_time`` (the ranks' agreed clock)."""
        logged = read_stats(stats, self.window_tokens)
        logged.update(
            tokens_per_s=logged.pop("window_tokens") / max(train_time - self.logged_time, 1e-9),
            epoch=epoch,
            ppl=perplexity(logged["nll_loss"]),
        )
        self.logger.log(logged, step=update, split="train")
        self.window_tokens, self.logged_time = 0, train_time
        self.shown = {"loss": f"{logged['loss']:.3f}", "tok_s": f"{logged['tokens_per_s']:.0f}"}

    def postfix(self, lr: float) -> dict[str, str]:
        """What the progress bar shows after an update: the last logged loss and tokens/s (reading
        every update's would stall an accelerator) and the update's learning rate."""
        return {"loss": self.shown["loss"], "lr": f"{lr:.2e}", "tok_s": self.shown["tok_s"]}
