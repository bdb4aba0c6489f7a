"""One definition of "the same configuration" (transformer/config/identity.py), used by
``compare.py``'s grouping, ``train.finished_runs`` and a resume's plugin check: a plugin's files join
a run's identity only where the run chose one of its options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import REPO_ROOT
from transformer.analysis import compare_sweeps
from transformer.config import Config, ConfigError, config_dict, identity_key, to_config, used_plugin_files
from transformer.plugins import import_plugins, plugin_files
from transformer.training.job.finished_runs import finished_twin
from transformer.training.job.run import _record_plugins

REGLU = REPO_ROOT / "examples" / "plugins" / "reglu"
RECORDED = {f"reglu/{k}": v for k, v in plugin_files(REGLU).items()}
"""What a run trained with ``plugins=[examples/plugins/reglu]`` records as ``plugin_files``."""


def _config(ffn: str = "relu", files: dict | None = None, **train) -> Config:
    cfg = OmegaConf.structured(Config)
    cfg.model.ffn.name = ffn
    cfg.train.precision = "fp32"
    for key, value in train.items():
        cfg.train[key] = value
    if files is not None:
        cfg.plugins, cfg.plugin_files = [str(REGLU)], files
    return to_config(cfg)


def test_a_plugin_loaded_but_not_chosen_is_no_part_of_the_identity():
    without, loaded = config_dict(_config()), config_dict(_config(files=RECORDED))
    assert used_plugin_files(loaded) == {} and identity_key(loaded) == identity_key(without)
    chosen = config_dict(_config("reglu", RECORDED))
    assert used_plugin_files(chosen) == RECORDED
    edited = config_dict(_config("reglu", {**RECORDED, "reglu/__init__.py": "0" * 64}))
    assert identity_key(edited) != identity_key(chosen)  # the chosen plugin's code tells runs apart
    # an option no plugin imported here registered: whose, unknown; every recorded plugin counts
    unknown = config_dict(_config(files=RECORDED))
    unknown["model"]["position"]["name"] = "t5_bias_not_imported_here"
    assert used_plugin_files(unknown) == RECORDED


def _run(folder: Path, cfg: Config, seed: int, bleu: float) -> None:
    """A finished run's folder as compare.py reads it (no hypotheses: no significance)."""
    folder.mkdir(parents=True)
    raw = {**config_dict(cfg), "seed": seed}
    (folder / "config.yaml").write_text(json.dumps(raw))
    results = {"bleu": bleu, "chrf": 2 * bleu, "test_split": "test", "params": 10, "config": raw}
    results["choices"] = {"model/ffn": cfg.model.ffn.name}
    results.update(precision="fp32", hardware={"torch": torch.__version__})
    (folder / "results.json").write_text(json.dumps(results))


def test_runs_with_a_plugin_loaded_but_not_chosen_group_with_runs_without_plugins(tmp_path):
    """The issue's trial: seeds trained with ``plugins=[...]`` and a built-in option are the same
    configuration as seeds trained without ``plugins=``; ``--baseline relu`` is not ambiguous."""
    _run(tmp_path / "s" / "relu_seed1", _config(), 1, 30.0)
    _run(tmp_path / "s" / "relu_seed2", _config(files=RECORDED), 2, 31.0)
    _run(tmp_path / "s" / "reglu_seed1", _config("reglu", RECORDED), 1, 32.0)
    comp = compare_sweeps([tmp_path / "s"], baseline="relu", n_bootstrap=0, length_buckets=None)
    assert {r["label"]: r["seeds"] for r in comp.rows} == {"relu": "1 2", "reglu": "1"}


def test_a_finished_twin_and_a_resume_follow_the_same_identity(tmp_path):
    twin = tmp_path / "runs" / "run"
    twin.mkdir(parents=True)
    results = {"config": config_dict(_config()), "precision": "fp32", "device": "cpu", "world_size": 1}
    results["hardware"] = {"torch": torch.__version__}
    (twin / "results.json").write_text(json.dumps(results))
    assert finished_twin(_config(files=RECORDED, finished_runs=str(twin.parent)), twin)[2] == ""
    chosen = finished_twin(_config("reglu", RECORDED, finished_runs=str(twin.parent)), twin)[2]
    assert "model.ffn.name ('relu' there, 'reglu' here)" in chosen and "plugin_files" in chosen
    # a resume without the plugin it loaded but did not choose continues; one that chose it does not
    plugins = import_plugins([REGLU])
    loaded = _config(files={**RECORDED, "reglu/__init__.py": "0" * 64})
    _record_plugins(loaded, [], object(), tmp_path, [])
    assert loaded.plugin_files == {}
    with pytest.raises(ConfigError, match="the plugin files of this run changed since it started"):
        _record_plugins(_config("reglu", {**RECORDED, "reglu/__init__.py": "0" * 64}), plugins, object(), tmp_path, [])
    kept = _config("reglu", RECORDED)
    _record_plugins(kept, plugins, object(), tmp_path, [])
    assert kept.plugin_files == RECORDED
