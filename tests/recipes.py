"""The resolved recipes that must not move when configs are reorganised.

``RECIPES`` names command lines of ``scripts/train.py``; ``tests/fixtures/recipes/<name>.json`` holds
each one's resolved job config as it composed before the defaults moved into the dataclasses
(written by ``python -m tests.recipes --write``), and ``tests/test_config_defaults.py`` composes
them again and compares every recorded field. Fields added to the schema since then are not in
the fixtures (they default, by the project's rule, to what older runs did).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from transformer.config import register_configs

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "recipes"
LADDER_STEPS = sorted(p.stem for p in (REPO_ROOT / "configs" / "ladder").glob("step*.yaml"))


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (REPO_ROOT / "configs" / group).glob("*.yaml"))


RECIPES: dict[str, list[str]] = {
    "default": [],
    **{f"ladder_{step}": ["experiment=ladder", f"ladder={step}"] for step in LADDER_STEPS},
    **{f"experiment_{name}": [f"experiment={name}"] for name in _options("experiment") if name != "ladder"},
    **{f"model_{name}": [f"model={name}"] for name in _options("model")},
    **{f"data_{name}": [f"data={name}"] for name in _options("data")},
    **{f"optim_{name}": [f"optim={name}"] for name in _options("optim")},
    **{f"lr_scheduler_{name}": [f"lr_scheduler={name}"] for name in _options("lr_scheduler")},
}
"""Fixture name -> the overrides of its command line."""


def compose_recipe(overrides: list[str]) -> dict:
    """The job config ``scripts/train.py <overrides>`` trains with, resolved, as plain containers."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True)


if __name__ == "__main__" and "--write" in sys.argv:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, overrides in RECIPES.items():
        (FIXTURES / f"{name}.json").write_text(json.dumps(compose_recipe(overrides), indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(RECIPES)} recipes to {FIXTURES}")
