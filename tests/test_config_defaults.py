"""One source of truth for defaults: the dataclasses hold every default, the
YAML files only what a preset, option or experiment changes; ``Config()`` is the recipe of a bare
``python scripts/train.py``; and the recipes saved before the defaults moved compose unchanged."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.recipes import FIXTURES, RECIPES, REPO_ROOT, compose_recipe
from transformer.config import (
    Config,
    budget_sentence,
    config_dict,
    time_budget,
    to_config,
    upgrade_config,
    validate_config,
)


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def test_config_is_the_bare_train_script_field_by_field():
    composed, default = _flat(compose_recipe([])), _flat(config_dict(Config()))
    assert composed.keys() == default.keys()
    assert {k: (composed[k], default[k]) for k in composed if composed[k] != default[k]} == {}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_compose_as_before_the_defaults_moved(name):
    """Every field recorded in the fixture has the same value now (the default time budget, once
    ``train.max_time: 1380``, is now ``null`` resolved by ``time_budget``; the flat attention fields
    of the fixtures are read as stored configs are, through ``upgrade_config``)."""
    before = _flat(upgrade_config(json.loads((FIXTURES / f"{name}.json").read_text())))  # recorded in the old shape
    before.pop("train.pad_to_multiple")  # added by the upgrade (what older runs did), not recorded by the fixture
    cfg = compose_recipe(RECIPES[name])
    now = _flat(cfg)
    now["train.max_time"] = time_budget(OmegaConf.create(cfg["train"]))
    moved = {k: (v, now.get(k, "<missing>")) for k, v in before.items() if now.get(k, "<missing>") != v}
    assert moved == {}


def test_group_option_files_hold_only_values_that_apply():
    """A value in an option file that equals the dataclass default (and so changes nothing) is a
    second copy of a default: only the option's name and what it changes may be written. (Model
    presets, experiments and ladder steps may restate a value their parent preset changed.)"""
    defaults = config_dict(Config())
    copies = []
    for group_dir in sorted(p for p in (REPO_ROOT / "configs").rglob("*") if p.is_dir()):
        parts = group_dir.relative_to(REPO_ROOT / "configs").parts
        if parts in (("model",), ("experiment",), ("ladder",), ("hparams_search",)):
            continue
        node = defaults
        for part in parts:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        for f in sorted(group_dir.glob("*.yaml")):
            values = OmegaConf.to_container(OmegaConf.load(f)) or {}
            copies += [
                f"{f.relative_to(REPO_ROOT)}: {key}: {value!r} is the default"
                for key, value in values.items()
                if key not in ("name", "defaults") and key in node and value == node[key]
            ]
    assert copies == []


def test_train_yaml_holds_no_values():
    root = OmegaConf.load(REPO_ROOT / "configs" / "train.yaml")
    assert set(root) == {"defaults", "hydra"}


def test_default_time_budget_gives_way_to_an_explicit_update_budget():
    cfg = compose_recipe([])
    assert time_budget(cfg.train if hasattr(cfg, "train") else OmegaConf.create(cfg["train"])) == 1380.0
    explicit = OmegaConf.create(compose_recipe(["train.max_updates=4000"])["train"])
    assert time_budget(explicit) == 0.0 and budget_sentence(explicit) == "train.max_updates=4000"
    both = OmegaConf.create(compose_recipe(["train.max_updates=4000", "train.max_time=60"])["train"])
    assert time_budget(both) == 60.0
    assert budget_sentence(both) == "train.max_updates=4000, or train.max_time=60s (whichever comes first)"
    bare = OmegaConf.create(compose_recipe([])["train"])
    assert budget_sentence(bare) == "1380 s of training (the default time budget; train.max_updates=N replaces it)"


def test_cosine_from_the_default_config_names_what_it_needs():
    from hydra import compose, initialize_config_dir

    from transformer.config import ConfigError, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        with pytest.raises(
            ConfigError,
            match=r"lr_scheduler=cosine needs train.max_updates > 0 .* e.g. "
            r"lr_scheduler=cosine train.max_updates=4000",
        ):
            validate_config(compose(config_name="train", overrides=["lr_scheduler=cosine"]))
        ok = compose(config_name="train", overrides=["lr_scheduler=cosine", "train.max_updates=4000"])
    validate_config(ok)
    assert to_config(ok).lr_scheduler.warmup_updates == 400
