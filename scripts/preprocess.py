"""Binarize a corpus once (Hydra app; config: configs/preprocess.yaml, the `data` group of training).

    python scripts/preprocess.py                                          # multi30k_en_de
    python scripts/preprocess.py data=parallel_text data.root=/data/wmt14 data.train_prefix=train \\
        data.valid_prefix=newstest2013 data.test_prefix=newstest2014 data.src_lang=en data.tgt_lang=de \\
        data.vocab_size=32000 data.cache_dir=/shared/cache data.preprocess_workers=16

Trains SentencePiece on a random sample of the training lines (``data.spm_input_sentence_size``),
streams every split, encodes chunks of lines in ``data.preprocess_workers`` processes and writes
flat token arrays + offsets with a manifest per split, atomically, into
``<data.cache_dir>/<data.name>-<key>/`` (see :mod:`transformer.data.dataset`). ``scripts/train.py``
with the same data options then finds the folder and maps it; ``data.binarized=<folder>`` reads it
without the raw files. A second run with unchanged inputs builds nothing. Prints one line per split
(pairs, tokens, lines dropped, bytes on disk) and the folder on stdout; exit status 1 with a
one-line message on stderr for bad data (naming file and line), 2 for an invalid config.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from transformer.cli import user_errors
from transformer.config import DataConfig
from transformer.data.errors import DataError

ROOT = Path(__file__).resolve().parents[1]  # the checkout: its configs/ are the scripts' config


@dataclass
class PreprocessConfig:
    """Schema of ``configs/preprocess.yaml``: the training ``data`` config and the splits to build."""

    data: DataConfig = field(default_factory=DataConfig)
    splits: list[str] | None = None


ConfigStore.instance().store(name="base_preprocess", node=PreprocessConfig)


def run(cfg: DictConfig) -> dict:
    """Build (or find) the binarized data of ``cfg.data``; returns the loader's statistics."""
    from transformer.data.binarize import read_manifest
    from transformer.data.dataset import load_translation_data

    if cfg.data.binarized:
        raise ValueError("data.binarized names a folder to read; preprocess writes into data.cache_dir instead")
    data = load_translation_data(cfg.data, splits=cfg.splits, log=lambda m: print(m, file=sys.stderr, flush=True))
    stats = data.stats
    for name, folder in stats["split_dirs"].items():
        manifest = read_manifest(folder)
        size = sum(p.stat().st_size for p in Path(folder).iterdir())
        c = manifest["counts"]
        print(
            f"{name:<18} {c['pairs']:>10,} pairs  {c['src_tokens']:>12,} + {c['tgt_tokens']:>12,} tokens  "
            f"{manifest['dropped']['empty_side']:>7,} dropped (empty side)  {size / 2**20:9.1f} MB  "
            f"{stats['split_cache'][name]}  {Path(folder).name}"
        )
    print(f"binarized data: {stats['cache_dir']}")
    print(json.dumps({"cache": stats["cache"], "seconds": stats["seconds"]}))
    return stats


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="preprocess")
def main(cfg: DictConfig) -> None:
    """Entry point: one-line errors, exit status 1 for bad data and 2 for a bad config."""
    with user_errors({ValueError: 2}, prefix="error: invalid configuration: "):  # DataError is a ValueError:
        with user_errors({DataError: 1}):  # it is reported (status 1) before the outer block sees it
            run(cfg)


if __name__ == "__main__":
    main()
