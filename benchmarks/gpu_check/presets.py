"""The models of the GPU check's ``realistic`` section (:data:`MODELS`: preset, overrides, family) and
their configs, at tiny sizes for the CPU smoke run (``--quick``)."""

from __future__ import annotations

from typing import Any

from benchmarks.train_step import preset

MODELS: dict[str, tuple[str, list[str], str]] = {  # name: (preset, overrides, family)
    "base": ("transformer_2017_base", [], "encoder-decoder"),
    "big": ("transformer_2017_big", [], "encoder-decoder"),
    "llama100m": (
        "llama_style",
        ["model.d_model=640", "model.n_heads=10", "model.d_ff=2560", "model.n_decoder_layers=12", "model.dropout=0.0"],
        "decoder-only",
    ),
}
QUICK_DIMS = {
    "encoder-decoder": [
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        "model.d_model=32",
        "model.n_heads=4",
        "model.d_ff=64",
    ],
    "decoder-only": ["model.n_decoder_layers=2", "model.d_model=32", "model.n_heads=4", "model.d_ff=64"],
}


def model_config(name: str, quick: bool, extra: list[str] | None = None) -> tuple[Any, Any, list[str]]:
    """``(model config, optim config, overrides)`` of a :data:`MODELS` entry (tiny dims with ``quick``),
    with ``extra`` overrides last."""
    name_preset, over, family = MODELS[name]
    over = over + (QUICK_DIMS[family] if quick else []) + list(extra or [])
    cfg, optim_cfg = preset(name_preset, over)
    return cfg, optim_cfg, over
