"""Metrics loggers: JSONL always, plus Weights & Biases (offline works without network) or
TensorBoard. ``log(metrics, step, split)``: ``step`` is the update count, ``split`` the stream
(``train``, ``valid``, ``test``); values are numbers, 0-d tensors or strings (JSONL and wandb only)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
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
        """Record ``metrics`` (name -> number, 0-d tensor or string) at update ``step`` for stream ``split``."""

    def close(self) -> None:
        """Flush and release resources; further :meth:`log` calls are not allowed."""

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class JsonlLogger(MetricsLogger):
    """Appends ``{"split", "update", **metrics, "time"}`` per call to ``run_dir/metrics.jsonl``, flushed.

    A resumed run appends to the same file (readers keep the last row per ``(split, update)``); a
    partial last line left by a crash is terminated first; non-finite floats are ``NaN``/``Infinity``."""

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
            ValueError: a metric named ``split``, ``update`` or ``time``.
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
    """A Weights & Biases run, metrics as ``{split}/{name}`` against the ``update`` axis.

    ``mode="offline"`` writes ``run_dir/wandb/offline-run-*`` without network (``wandb sync`` later);
    ``"online"`` needs a login; ``"disabled"`` does nothing. wandb's console capture and probes are off.

    Raises:
        ValueError: an unknown mode.
        ImportError: wandb is not installed.
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
    """Numeric metrics as TensorBoard scalars ``{split}/{name}`` in ``run_dir/tensorboard``.

    Raises:
        ImportError: tensorboard is not installed.
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
    """Fans every call out to several loggers; with none it is a no-op (non-main ranks)."""

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


LoggerFactory = Callable[[Any, Path, str, Mapping[str, Any]], MetricsLogger]
"""``factory(cfg, run_dir, run_name, config_dict) -> MetricsLogger``: ``cfg`` is the ``logger`` node."""

LOGGERS: dict[str, LoggerFactory | None] = {
    "none": None,  # metrics.jsonl only
    "wandb": lambda cfg, run_dir, run_name, config: WandbLogger(run_dir, cfg.project, run_name, config, mode=cfg.mode),
    "tensorboard": lambda cfg, run_dir, run_name, config: TensorboardLogger(run_dir),
}
"""``logger.name`` -> the factory of the logger beside JSONL (:func:`transformer.registry.register_logger` adds one)."""


def build_loggers(
    cfg: Any, run_dir: Path | str, run_name: str, config_dict: Mapping[str, Any], is_main: bool
) -> MultiLogger:
    """A :class:`MultiLogger`: JSONL plus the logger :data:`LOGGERS` names ``cfg.name``; a no-op
    unless ``is_main``.

    Raises:
        ValueError: a ``cfg.name`` :data:`LOGGERS` does not hold.
        TypeError: its factory returned no logger (an object without ``log`` and ``close``).
    """
    if cfg.name not in LOGGERS:
        raise ValueError(f"logger.name={cfg.name!r} is not one of {', '.join(LOGGERS)}")
    if not is_main:
        return MultiLogger()
    loggers: list[MetricsLogger] = [JsonlLogger(run_dir)]
    factory = LOGGERS[cfg.name]
    if factory is not None:
        logger = factory(cfg, Path(run_dir), run_name, config_dict)
        if not (callable(getattr(logger, "log", None)) and callable(getattr(logger, "close", None))):
            raise TypeError(f"logger={cfg.name}: its factory returned {logger!r}, not a MetricsLogger")
        loggers.append(logger)
    return MultiLogger(loggers)


__all__ = [
    "LOGGERS",
    "JsonlLogger",
    "MetricsLogger",
    "MultiLogger",
    "TensorboardLogger",
    "WandbLogger",
    "build_loggers",
]
