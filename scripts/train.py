"""Train one model (or a sweep with -m): the Hydra entry point of every experiment.

    python scripts/train.py                                   # transformer_small on multi30k_en_de, 23 min of training
    python scripts/train.py model=llama_style_tiny data=multi30k_de_en train.max_updates=4000
    python scripts/train.py -m model/ffn=relu,swiglu seed=1,2,3
    python scripts/train.py model/position=rope --cfg job     # print the resolved config only
    torchrun --nproc_per_node=2 scripts/train.py ...          # data parallel

The run folder (Hydra's output dir) receives metrics.jsonl, checkpoints, test hypotheses and
results.json.

User errors (an invalid config, unusable data, a checkpoint that cannot be resumed, a diverged
run, a run folder another process is writing) end with one line ``error: ...`` on stderr and exit
status 2 (configuration) or 1 (others); ``HYDRA_FULL_ERROR=1`` shows the traceback instead. In a
sweep (``-m``) a failed job prints its line and the other jobs still run (Hydra reports the failure
at the end). A signal of ``train.stop_signals`` (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) stops training
after the update in progress, saves ``checkpoint_last`` and exits with status 75; the same command
with ``train.resume=auto`` continues it. The return value, for a sweeper such as Optuna
(``hydra/sweeper=optuna``), is the best validation ``train.best_metric``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer.config import register_configs
from transformer.training.command import prepare_command_line, train_job

ROOT = Path(__file__).resolve().parents[1]  # the checkout: its configs/ are the scripts' config

register_configs()


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Validate the config, then train, validate, test and write results.json
    (:func:`transformer.training.command.train_job`).

    Returns:
        The run's best validation ``train.best_metric`` (what a Hydra sweeper optimises; never a test
        score). A run stopped by a signal of ``train.stop_signals`` exits with status 75 after
        saving ``checkpoint_last``.
    """
    return train_job(cfg)


if __name__ == "__main__":
    # plugins=[...] first: their options exist before Hydra composes; unknown keys refused before any folder
    sys.argv[1:] = prepare_command_line(sys.argv[1:], ROOT / "configs")
    main()
