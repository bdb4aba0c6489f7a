"""A multirun names each job's folder by the values its command line sweeps, as the studies name
theirs (transformer.config.runtime.sweep_subdir, ``hydra.sweep.subdir`` of configs/train.yaml)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import train_in_process
from transformer.config import SWEPT_KEYS_ENV
from transformer.config.runtime import sweep_subdir


@pytest.mark.parametrize(
    ("swept", "task", "sweeper", "folder"),
    [
        ("model/ffn,seed", ["model/ffn=swiglu", "seed=2", "train.max_updates=5"], "basic", "swiglu_seed2"),
        ("model.dropout", ["model.dropout=0.1"], "basic", "dropout=0.1"),
        ("ladder,optim", ["ladder=step5_gqa", "optim=adam"], "basic", "step5_gqa_adam"),
        (
            "model.dropout,train.dropout",
            ["model.dropout=0.1", "train.dropout=0.2"],
            "basic",
            "model.dropout=0.1_train.dropout=0.2",
        ),
        ("plugins", ["plugins=[a/b]"], "basic", "plugins=[a-b]"),
        ("", ["model.dropout=0.1"], "basic", "7"),  # swept by a config's sweeper params: numbered
        ("model.dropout", ["model.dropout=0.1"], "optuna", "7"),  # sampled values may repeat: numbered
    ],
)
def test_a_job_folder_is_named_by_its_swept_values(swept, task, sweeper, folder, monkeypatch):
    monkeypatch.setenv(SWEPT_KEYS_ENV, swept)
    assert sweep_subdir(task, 7, sweeper) == folder


def test_a_multiruns_jobs_get_the_folders_their_values_name(tmp_path, monkeypatch, capsys):
    """Hydra resolves the name for every job of a plain ``-m`` (here both refused at validation, so
    they leave no folder: the sweep's record of them names the folders)."""
    sweep = tmp_path / "sweep"
    code, err = train_in_process(
        monkeypatch, capsys, tmp_path, "-m", "model.n_heads=3,5", "train.max_updates=1", f"hydra.sweep.dir={sweep}"
    )
    assert code == 1 and err[-1].startswith("error: 0 of 2 jobs finished; 2 refused: n_heads=3: "), err
    records = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert [r["folder"] for r in records] == ["n_heads=3", "n_heads=5"]
