"""Metrics loggers: JSONL always, plus Weights & Biases (offline works without network) or
TensorBoard.

Every logger takes ``log(metrics, step, split)`` where ``step`` is the update count and ``split``
names the stream (``"train"``, ``"valid"``, ``"test"``). Values may be Python numbers, 0-d tensors
or strings (strings go to JSONL and wandb only).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

_RESERVED = ("split", "update", "time")


def _plain(value: Any) -> Any:
    """A JSON-friendly value: 0-d tensors and numpy scalars become Python numbers."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return value.item()
    return value


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        v = _plain(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


class MetricsLogger:
    """Interface of a metrics sink; the base class itself discards everything."""

    def log(self, metrics: Mapping[str, Any], step: int, split: str) -> None:
        """Record ``metrics`` at update ``step`` for stream ``split``.

        Args:
            metrics: name -> number, 0-d tensor or string (e.g. ``{"loss": 4.2, "lr": 5e-4}``).
            step: the update count.
            split: ``"train"``, ``"valid"``, ``"test"``...
        """

    def close(self) -> None:
        """Flush and release resources; further :meth:`log` calls are not allowed."""

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class JsonlLogger(MetricsLogger):
    """Appends one JSON object per call to ``run_dir/metrics.jsonl``:
    ``{"split": ..., "update": step, **metrics, "time": unix seconds}``.

    The file is opened in append mode, so a resumed run continues the same file (rows logged after
    the resumed checkpoint appear twice; readers keep the last row per ``(split, update)``). A
    partial last line left by a crash is terminated first. Each row is flushed. Non-finite floats
    are written as ``NaN``/``Infinity`` (Python's ``json`` reads them back).

    Args:
        run_dir: the run folder (created when missing).
    """

    FILENAME = "metrics.jsonl"

    def __init__(self, run_dir: Path | str) -> None:
        self.path = Path(run_dir) / self.FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._file = open(self.path, "a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")
            self._file.flush()

    def log(self, metrics: Mapping[str, Any], step: int, split: str) -> None:
        """Append one row.

        Raises:
            ValueError: when a metric is named ``split``, ``update`` or ``time``.
        """
        clash = [k for k in _RESERVED if k in metrics]
        if clash:
            raise ValueError(f"metric names {clash} are reserved by the JSONL row format")
        row = {"split": split, "update": int(step), **{k: _plain(v) for k, v in metrics.items()}, "time": time.time()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        if not self._file.closed:
            self._file.close()


class WandbLogger(MetricsLogger):
    """Weights & Biases run (``wandb`` imported lazily). Metrics are logged as ``{split}/{name}``
    against the ``update`` axis (``define_metric``), so a resumed run may log smaller updates.

    ``mode="offline"`` writes ``run_dir/wandb/offline-run-*`` without touching the network (sync
    later with ``wandb sync``); ``"online"`` needs a login; ``"disabled"`` does nothing. Console
    capture, git, system stats and hardware probing are off, and wandb is silent.

    Args:
        run_dir: the run folder; wandb writes under ``run_dir/wandb``.
        project: the wandb project (``logger.project``).
        run_name: the run's display name.
        config: the run's configuration as a plain dict.
        mode: ``"offline"`` (default), ``"online"`` or ``"disabled"`` (``logger.mode``).

    Raises:
        ValueError: for an unknown mode.
        ImportError: when wandb is not installed.
    """

    def __init__(
        self, run_dir: Path | str, project: str, run_name: str, config: Mapping[str, Any], mode: str = "offline"
    ) -> None:
        if mode not in ("offline", "online", "disabled"):
            raise ValueError(f"logger.mode={mode!r} is not one of offline, online, disabled")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            silent=True,
            console="off",
            disable_git=True,
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
        )
        self._run = wandb.init(
            project=project,
            name=run_name,
            dir=str(run_dir),
            config=dict(config),
            mode=mode,
            settings=settings,
            reinit="create_new",
        )
        self._run.define_metric("update")
        self._run.define_metric("*", step_metric="update")

    @property
    def run_path(self) -> Path | None:
        """The local folder of the run (``run_dir/wandb/offline-run-...``), None when disabled."""
        folder = getattr(self._run, "dir", None)  # .../offline-run-*/files
        return Path(folder).parent if folder else None

    def log(self, metrics: Mapping[str, Any], step: int, split: str) -> None:
        """Log ``{split}/{name}: value`` plus ``update: step``."""
        self._run.log({"update": int(step), **{f"{split}/{k}": _plain(v) for k, v in metrics.items()}})

    def close(self) -> None:
        """Finish the run (writes the offline run's last records)."""
        if self._run is not None:
            self._run.finish()
            self._run = None


class TensorboardLogger(MetricsLogger):
    """TensorBoard event files in ``run_dir/tensorboard`` (``torch.utils.tensorboard``, which needs
    the ``tensorboard`` package). Numeric metrics only, as scalars ``{split}/{name}`` at ``step``.

    Args:
        run_dir: the run folder.

    Raises:
        ImportError: when tensorboard is not installed.
    """

    def __init__(self, run_dir: Path | str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, metrics: Mapping[str, Any], step: int, split: str) -> None:
        """Add one scalar per numeric metric; strings are skipped."""
        for k, v in _numeric(metrics).items():
            self._writer.add_scalar(f"{split}/{k}", v, global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class MultiLogger(MetricsLogger):
    """Fans every call out to several loggers; with none it is a no-op (non-main ranks).

    Args:
        loggers: the loggers to call, in order.
    """

    def __init__(self, loggers: Iterable[MetricsLogger] = ()) -> None:
        self.loggers = list(loggers)

    def log(self, metrics: Mapping[str, Any], step: int, split: str) -> None:
        """Call every logger's :meth:`log`."""
        for logger in self.loggers:
            logger.log(metrics, step, split)

    def close(self) -> None:
        """Close every logger (all of them, even when one raises; the first error is re-raised)."""
        error: BaseException | None = None
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as e:  # keep closing the others
                error = error or e
        self.loggers = []
        if error is not None:
            raise error


def build_loggers(
    cfg: Any, run_dir: Path | str, run_name: str, config_dict: Mapping[str, Any], is_main: bool
) -> MultiLogger:
    """The loggers of a run: JSONL always, plus ``cfg.name`` (``wandb`` or ``tensorboard``).

    Args:
        cfg: a :class:`transformer.config.LoggerConfig` (``name``, ``project``, ``mode``).
        run_dir: the run folder.
        run_name: the run's display name (wandb).
        config_dict: the resolved configuration as a plain dict (wandb's run config).
        is_main: False on non-zero distributed ranks, which get a no-op logger.

    Returns:
        A :class:`MultiLogger`.

    Raises:
        ValueError: for an unknown ``cfg.name``.
    """
    if cfg.name not in ("none", "wandb", "tensorboard"):
        raise ValueError(f"logger.name={cfg.name!r} is not one of none, wandb, tensorboard")
    if not is_main:
        return MultiLogger()
    loggers: list[MetricsLogger] = [JsonlLogger(run_dir)]
    if cfg.name == "wandb":
        loggers.append(WandbLogger(run_dir, cfg.project, run_name, config_dict, mode=cfg.mode))
    elif cfg.name == "tensorboard":
        loggers.append(TensorboardLogger(run_dir))
    return MultiLogger(loggers)


__all__ = [
    "JsonlLogger",
    "MetricsLogger",
    "MultiLogger",
    "TensorboardLogger",
    "WandbLogger",
    "build_loggers",
]
