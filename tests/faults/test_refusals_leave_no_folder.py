"""Every refusal of ``scripts/train.py`` before the first update that docs/runs.md lists leaves no
folder behind: an invalid configuration, a misspelt option, unusable data (a missing data folder), a
CUDA device on a machine without one, a ``train.finished_runs`` folder that does not exist; and a
refused resume (a changed field, missing data, no CUDA device, a checkpoint that cannot be read)
leaves its folder as it was. (A key no node has and a folder in use: ``tests/test_config_fields.py``,
``tests/training/job/test_run_lock.py``.)

The script runs in this process (its ``__main__``, as ``python scripts/train.py`` runs it), one to
two seconds a refusal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import train_in_process
from tests.faults.conftest import small_cli_args

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a CUDA device accepts train.device=cuda")


def _args(corpus: Path, run: Path, *overrides: str) -> list[str]:
    """The tiny run's overrides, writing into ``run``; an override of a key they set replaces it."""
    keys = {o.split("=", 1)[0] for o in overrides}
    tiny = [a for a in small_cli_args(corpus, run) if a.split("=", 1)[0] not in keys | {"run_dir"}]
    return [*tiny, f"hydra.run.dir={run}", *overrides]


def _contents(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` and a file's bytes (the lock's holder aside: a run rewrites it when
    it takes it)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() and p.name != ".lock" else None
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    ("overrides", "status", "line"),
    [
        (["model.n_heads=3"], 2, "error: invalid configuration: model.d_model=32 is not divisible by model.n_heads=3"),
        (["model/position=rotary"], 2, "error: model/position=rotary is not an option of model/position"),
        (["data.root={tmp}/no_data", "data.download=false"], 1, "error: "),
        pytest.param(["train.device=cuda"], 2, "error: train.device=cuda: torch sees no CUDA device", marks=NO_CUDA),
        (["train.finished_runs={tmp}/no_runs"], 2, "error: train.finished_runs="),
    ],
    ids=["invalid-config", "misspelt-option", "missing-data", "no-cuda", "no-finished-runs-folder"],
)
def test_a_refused_new_run_leaves_no_folder(overrides, status, line, gappy_corpus, tmp_path, monkeypatch, capsys):
    run = tmp_path / "runs" / "run"
    args = _args(gappy_corpus, run, *(o.format(tmp=tmp_path) for o in overrides))
    code, err = train_in_process(monkeypatch, capsys, tmp_path, *args)
    assert code == status and len(err) == 1 and err[0].startswith(line), err
    assert not (tmp_path / "runs").exists()


@NO_CUDA
def test_a_refused_multirun_job_leaves_no_job_folder(gappy_corpus, tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    args = [a for a in small_cli_args(gappy_corpus, tmp_path) if not a.startswith("run_dir=")]
    code, err = train_in_process(
        monkeypatch, capsys, tmp_path, "-m", *args, "train.device=cuda", "seed=1,2", f"hydra.sweep.dir={sweep}"
    )
    assert code == 1 and err[-1].startswith("error: 0 of 2 jobs finished; 2 refused"), err
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == []  # the sweep's own record, no job folder


@pytest.mark.parametrize(
    "overrides",
    [
        ["model/position=rope"],  # a field a resume cannot change
        ["data.root={tmp}/no_data", "data.download=false"],
        pytest.param(["train.device=cuda"], marks=NO_CUDA),
        ["train.resume_from={run}/checkpoint_3"],  # no such checkpoint
    ],
    ids=["changed-field", "missing-data", "no-cuda", "missing-checkpoint"],
)
def test_a_refused_resume_leaves_its_folder_as_it_was(
    overrides, trained_run, gappy_corpus, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = _contents(run)
    overrides = [o.format(tmp=tmp_path, run=run) for o in overrides]
    args = _args(gappy_corpus, run, "train.resume=true", "train.max_updates=8", *overrides)
    code, err = train_in_process(monkeypatch, capsys, tmp_path, *args)
    assert code in (1, 2) and len(err) == 1 and err[0].startswith("error: "), err
    assert _contents(run) == before  # Hydra's record of the resume taken back too
