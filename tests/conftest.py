"""Shared test fixtures: deterministic seeds, tiny model configs, the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from transformer.config import ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TRANSFORMER_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))

torch.set_num_threads(1)  # tiny models gain nothing from more; avoids oversubscription


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def tiny_model_config(**overrides) -> "OmegaConf":
    """A 2+2-layer, width-32 model config (dropout 0) as a DictConfig; dotted keys allowed."""
    cfg = OmegaConf.structured(
        ModelConfig(n_encoder_layers=2, n_decoder_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
    )
    for key, value in overrides.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    return cfg
