"""The training progress bar (tqdm): a total and an ETA whenever the run has a budget.

With ``train.max_updates`` the bar counts updates towards it; with only ``train.max_time`` it
counts training seconds towards that limit (the postfix shows the update); with neither (an epoch
budget) it counts updates without a total. A resumed run starts the bar where its checkpoint is.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

__all__ = ["TrainingBar"]


class TrainingBar:
    """One bar for :meth:`~transformer.training.loop.trainer.Trainer.fit` (a no-op when ``enabled`` is False).

    Args:
        max_updates: ``train.max_updates`` (0: none).
        max_time: ``train.max_time`` in seconds (0: none).
        update: the update the run starts from (a resume's).
        train_time: the training seconds already spent (a resume's).
        desc: the bar's label.
        enabled: rank 0 with ``train.progress``.
        file: where the bar is drawn (default stderr).
    """

    def __init__(
        self,
        *,
        max_updates: int,
        max_time: float,
        update: int,
        train_time: float,
        desc: str,
        enabled: bool,
        file: Any = None,
    ) -> None:
        self.by_time = max_updates <= 0 and max_time > 0
        self.bar = None
        if not enabled:
            return
        common: dict[str, Any] = dict(desc=desc, dynamic_ncols=True, mininterval=2.0, file=file or sys.stderr)
        if self.by_time:
            self.bar = tqdm(
                total=float(max_time),
                initial=min(train_time, float(max_time)),
                unit="s",
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]",
                **common,
            )
        else:
            self.bar = tqdm(total=max_updates or None, initial=update, unit="upd", **common)

    def step(self, seconds: float, update: int, **postfix: str) -> None:
        """Advance by one update that took ``seconds`` of training; show ``postfix`` values."""
        if self.bar is None:
            return
        if self.by_time:
            self.bar.set_postfix(upd=update, **postfix, refresh=False)
            self.bar.update(min(seconds, max(self.bar.total - self.bar.n, 0.0)))
        else:
            self.bar.set_postfix(**postfix, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
