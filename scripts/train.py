"""Train one model (or a sweep with -m): the Hydra entry point of every experiment.

    python scripts/train.py                                   # transformer_tiny on multi30k_en_de
    python scripts/train.py model=llama_style_tiny data=multi30k_de_en train.max_updates=4000
    python scripts/train.py -m model/ffn=relu,swiglu seed=1,2,3
    python scripts/train.py model/position=rope --cfg job     # print the resolved config only
    torchrun --nproc_per_node=2 scripts/train.py ...          # data parallel

The run folder (Hydra's output dir) receives metrics.jsonl, checkpoints, test hypotheses and
results.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow running from a checkout without installing
    sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer.config import ConfigError, register_configs, validate_config  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Validate the config, then train, validate, test and write results.json.

    Returns:
        The test BLEU (what a Hydra sweeper would optimise).
    """
    try:
        validate_config(cfg)
    except ConfigError as err:
        print(f"error: invalid configuration: {err}", file=sys.stderr)
        sys.exit(2)
    from transformer.training.trainer import TrainingError, train

    try:
        results = train(cfg)
    except TrainingError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    return results.get("bleu")


if __name__ == "__main__":
    main()
