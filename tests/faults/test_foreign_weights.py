"""Weights copied into a run folder from a run with another architecture (same
tensor names and shapes: sinusoidal vs RoPE positions) must not load silently."""

from __future__ import annotations

import shutil

import pytest

from tests.generation.helpers import make_run_dir
from transformer.generation import LoadError, load_run


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    return make_run_dir(root / "sinusoidal")[0], make_run_dir(root / "rope", position__name="rope", seed=1)[0]


def test_weights_file_from_another_save_is_refused(two_runs, tmp_path):
    sinusoidal, rope = two_runs
    run = tmp_path / "run"
    shutil.copytree(sinusoidal, run)
    shutil.copyfile(rope / "checkpoint_best.safetensors", run / "checkpoint_best.safetensors")
    with pytest.raises(LoadError, match=r"does not belong to checkpoint_best\.json \(checkpoint_id"):
        load_run(run)


def test_whole_checkpoint_from_another_architecture_is_refused(two_runs, tmp_path):
    sinusoidal, rope = two_runs
    run = tmp_path / "run"
    shutil.copytree(sinusoidal, run)
    for suffix in (".safetensors", ".pt", ".json"):
        shutil.copyfile(rope / f"checkpoint_best{suffix}", run / f"checkpoint_best{suffix}")
    with pytest.raises(LoadError, match=r"another model config.*position\.name: rope in the weights vs sinusoidal"):
        load_run(run)
