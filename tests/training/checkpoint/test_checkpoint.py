"""Checkpoints: round trip, tied weights, weights_only state, crash safety, manager, RNG, averaging."""

import json
import os
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import transformer.runs.io
from transformer.training.checkpoint import (
    CheckpointError,
    CheckpointManager,
    average_checkpoints,
    get_rng_state,
    load_checkpoint,
    save_checkpoint,
    save_weights,
    set_rng_state,
)


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(7, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 7, bias=False)
        self.out.weight = self.embed.weight


def _train_state(update=10):
    model = _Tied()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = model.out(model.proj(model.embed(torch.tensor([1, 2])))).sum()
    loss.backward()
    opt.step()
    return {
        "optimizer": opt.state_dict(),
        "scheduler": {"last_epoch": update, "_step_count": update + 1},
        "rng": get_rng_state(),
        "sampler": {"epoch": 2, "offset": 17, "order": torch.randperm(5)},
        "update": update,
        "epoch": 2,
        "best_metric": float("nan"),
        "config": {"model": {"d_model": 4}, "betas": (0.9, 0.98), "name": None},
    }


def test_round_trip_with_tied_weights(tmp_path):
    torch.manual_seed(0)
    model = _Tied()
    state = _train_state()
    stem = save_checkpoint(tmp_path, "checkpoint_last", model.state_dict(), state)
    assert stem == tmp_path / "checkpoint_last"
    assert {p.name for p in tmp_path.iterdir()} == {
        "checkpoint_last.safetensors",
        "checkpoint_last.pt",
        "checkpoint_last.json",
    }
    weights, loaded = load_checkpoint(tmp_path, "checkpoint_last")
    # both names of the tied weight are stored (one as a clone)
    assert set(weights) == set(model.state_dict())
    fresh = _Tied()
    fresh.load_state_dict(weights, strict=True)
    assert fresh.out.weight is fresh.embed.weight  # still tied after loading
    for k, v in model.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v)
    assert loaded["update"] == 10 and loaded["config"]["betas"] == (0.9, 0.98)
    torch.testing.assert_close(loaded["sampler"]["order"], state["sampler"]["order"])
    opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    opt.load_state_dict(loaded["optimizer"])
    meta = json.loads((tmp_path / "checkpoint_last.json").read_text())
    assert meta["update"] == 10 and meta["epoch"] == 2 and meta["num_tensors"] == 4
    # the training state is loadable without pickle-by-class
    raw = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    assert raw["checkpoint_id"] == meta["checkpoint_id"]


def test_unplain_train_state_is_rejected_before_writing(tmp_path):
    class Custom:
        pass

    with pytest.raises(TypeError, match=r"train_state\['config'\]\['x'\] is a .*Custom"):
        save_checkpoint(tmp_path, "c", {"w": torch.ones(1)}, {"config": {"x": Custom()}})
    with pytest.raises(TypeError, match="numpy"):
        save_checkpoint(tmp_path, "c", {"w": torch.ones(1)}, {"a": np.zeros(2)})
    with pytest.raises(TypeError, match="not a tensor"):
        save_checkpoint(tmp_path, "c", {"w": 1.0}, {})
    assert list(tmp_path.iterdir()) == []


def _good(tmp_path):
    save_checkpoint(tmp_path, "checkpoint_last", {"w": torch.zeros(3)}, {"update": 1})


def _assert_good_and_clean(tmp_path):
    weights, state = load_checkpoint(tmp_path, "checkpoint_last")
    assert state["update"] == 1 and torch.equal(weights["w"], torch.zeros(3))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_crash_while_writing_weights_keeps_previous_checkpoint(tmp_path, monkeypatch):
    _good(tmp_path)

    def half_written(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 11)
        raise OSError("disk full")

    monkeypatch.setattr(transformer.runs.io, "save_file", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, "checkpoint_last", {"w": torch.ones(3)}, {"update": 2})
    _assert_good_and_clean(tmp_path)


def test_crash_while_writing_state_keeps_previous_checkpoint(tmp_path, monkeypatch):
    _good(tmp_path)
    real_save = torch.save

    def killed(obj, f, *a, **kw):
        real_save({"partial": torch.ones(2)}, f)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        CheckpointManager(tmp_path).save(2, {"w": torch.ones(3)}, {"update": 2}, is_best=True, numbered=True)
    monkeypatch.setattr(torch, "save", real_save)
    _assert_good_and_clean(tmp_path)


def test_crash_between_renames_is_detected(tmp_path, monkeypatch):
    _good(tmp_path)
    real_replace, calls = os.replace, []

    def replace_once(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("power cut")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_once)
    with pytest.raises(OSError, match="power cut"):
        save_checkpoint(tmp_path, "checkpoint_last", {"w": torch.ones(3)}, {"update": 2})
    monkeypatch.setattr(os, "replace", real_replace)
    with pytest.raises(CheckpointError, match="different saves"):
        load_checkpoint(tmp_path, "checkpoint_last")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_crash_at_any_rename_of_a_save_never_leaves_checkpoint_last_without_its_numbered_and_best(
    tmp_path, monkeypatch
):
    # kill -9 between the files of one save: checkpoint_last is either the previous save's (the
    # resume repeats the update and writes them all again) or this one's with its numbered and
    # best checkpoints complete, so a resumed run averages the same checkpoints as an uninterrupted one
    real_replace = os.replace
    for crash_at in range(1, 10):
        folder = tmp_path / str(crash_at)
        mgr = CheckpointManager(folder)
        mgr.save(1, {"w": torch.full((3,), 1.0)}, {"update": 1}, is_best=True, numbered=True)
        calls = []

        def replace(src, dst, calls=calls, crash_at=crash_at):
            calls.append(dst)
            if len(calls) == crash_at:
                raise KeyboardInterrupt  # the process dies here
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        try:
            mgr.save(2, {"w": torch.full((3,), 2.0)}, {"update": 2}, is_best=True, numbered=True)
        except KeyboardInterrupt:
            pass
        monkeypatch.setattr(os, "replace", real_replace)
        try:
            _, state = load_checkpoint(folder, "checkpoint_last")
        except CheckpointError as e:  # between checkpoint_last's own renames: refused, never mixed
            assert "different saves" in str(e) and crash_at > 6, crash_at
            state = {"update": 2}  # the numbered and best checkpoints of this save are complete
        if state["update"] == 2:
            for name in ("checkpoint_2", "checkpoint_best"):
                weights, other = load_checkpoint(folder, name)
                assert other["update"] == 2 and weights["w"][0].item() == 2.0, (crash_at, name)
        else:
            assert state["update"] == 1, crash_at
            mgr.save(2, {"w": torch.full((3,), 2.0)}, {"update": 2}, is_best=True, numbered=True)  # the resume
        assert [p.name for p in mgr.numbered()] == ["checkpoint_1", "checkpoint_2"], crash_at
    assert len(calls) == 9  # the last pass ran to the end: 3 files x (numbered, best, last)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint_last.safetensors"):
        load_checkpoint(tmp_path, "checkpoint_last")
    _good(tmp_path)
    (tmp_path / "checkpoint_last.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(tmp_path, "checkpoint_last")


def test_manager_last_best_numbered_and_pruning(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    assert mgr.latest() is None and mgr.best() is None and mgr.numbered() == []
    for update in (100, 200, 300, 1000):
        mgr.save(
            update, {"w": torch.full((2,), float(update))}, {"update": update}, is_best=update == 200, numbered=True
        )
    mgr.save(1100, {"w": torch.full((2,), 1100.0)}, {"update": 1100})  # not numbered
    assert mgr.numbered() == [tmp_path / "checkpoint_300", tmp_path / "checkpoint_1000"]
    assert not (tmp_path / "checkpoint_100.pt").exists() and not (tmp_path / "checkpoint_200.json").exists()
    assert mgr.latest() == tmp_path / "checkpoint_last"
    for stem, update in [(mgr.latest(), 1100), (mgr.best(), 200), (mgr.numbered()[-1], 1000)]:
        weights, state = load_checkpoint(stem.parent, stem.name)
        assert state["update"] == update and weights["w"][0].item() == update
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=-1)
    keep_all = CheckpointManager(tmp_path / "all", keep_last=0)
    for update in range(1, 8):
        keep_all.save(update, {"w": torch.zeros(1)}, {}, numbered=True)
    assert len(keep_all.numbered()) == 7


def test_rng_round_trip_through_checkpoint(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    save_checkpoint(tmp_path, "c", {"w": torch.zeros(1)}, {"rng": get_rng_state()})
    expected = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    _, state = load_checkpoint(tmp_path, "c")
    set_rng_state(state["rng"])
    got = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    assert got[:3] == expected[:3]
    torch.testing.assert_close(got[3], expected[3], rtol=0, atol=0)


def test_average_checkpoints_by_value(tmp_path):
    stems = []
    for i, value in enumerate([1.0, 2.0, 6.0]):
        state = {
            "w": torch.full((2, 2), value),
            "h": torch.tensor([value, 0.1], dtype=torch.bfloat16),
            "count": torch.tensor(i),
        }
        stems.append(save_checkpoint(tmp_path, f"checkpoint_{i}", state, {}))
    avg = average_checkpoints(stems)
    torch.testing.assert_close(avg["w"], torch.full((2, 2), 3.0))
    assert avg["h"].dtype == torch.bfloat16
    torch.testing.assert_close(avg["h"], torch.tensor([3.0, 0.1], dtype=torch.bfloat16))
    assert avg["count"].item() == 2  # integer buffers come from the last checkpoint
    # tied weights stay separate tensors and can be written again
    model = _Tied()
    a = save_checkpoint(tmp_path, "t0", model.state_dict(), {})
    b = save_checkpoint(tmp_path, "t1", model.state_dict(), {})
    out = save_weights(tmp_path / "avg.safetensors", average_checkpoints([a, str(b) + ".safetensors"]))
    torch.testing.assert_close(load_file(out)["out.weight"], model.embed.weight.detach())


def test_average_checkpoints_errors_name_the_file(tmp_path):
    a = save_checkpoint(tmp_path, "a", {"w": torch.zeros(2), "b": torch.zeros(1)}, {})
    b = save_checkpoint(tmp_path, "b", {"w": torch.zeros(2)}, {})
    c = save_checkpoint(tmp_path, "c", {"w": torch.zeros(3), "b": torch.zeros(1)}, {})
    with pytest.raises(ValueError, match=r"b\.safetensors does not have .*missing \['b'\]"):
        average_checkpoints([a, b])
    with pytest.raises(ValueError, match=r"c\.safetensors: w is"):
        average_checkpoints([a, c])
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])
