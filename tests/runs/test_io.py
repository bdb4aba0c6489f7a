"""transformer.runs.io: atomic writes (all-or-nothing, no temporary files left) and the safetensors reader."""

import os

import pytest
import torch

from transformer.runs import io as tio


def test_atomic_write_text_and_bytes_replace_whole_files(tmp_path):
    path = tmp_path / "sub" / "results.json"
    assert tio.atomic_write_text(path, "first\n") == path
    assert path.read_text() == "first\n"
    tio.atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]


def test_atomic_write_failure_keeps_old_file_and_removes_temp(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("good")

    def half(tmp):
        tmp.write_text("hal")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        tio.atomic_write(path, half)
    assert path.read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]


def test_atomic_write_all_replaces_nothing_until_every_file_is_staged(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("old a")
    b.write_text("old b")

    def fail(tmp):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tio.atomic_write_all([(a, lambda tmp: tmp.write_text("new a")), (b, fail)])
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    tio.atomic_write_all([(a, lambda tmp: tmp.write_text("new a")), (b, lambda tmp: tmp.write_text("new b"))])
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_safetensors_round_trip_with_shared_storage_and_metadata(tmp_path):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"embed": w, "out": w, "t": w.t(), "ids": torch.tensor([1, 2, 3])}
    path = tio.write_safetensors(tmp_path / "w.safetensors", state, metadata={"format": "x"})
    tensors, meta = tio.read_safetensors(path)
    assert meta == {"format": "x"}
    assert tensors.keys() == state.keys()
    for k, v in state.items():
        torch.testing.assert_close(tensors[k], v, rtol=0, atol=0)
    assert tensors["embed"].data_ptr() != tensors["out"].data_ptr()


def test_read_safetensors_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        tio.read_safetensors(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"garbage")
    with pytest.raises(tio.SafetensorsReadError, match=r"cannot read .*bad\.safetensors"):
        tio.read_safetensors(bad)


def test_weights_for_safetensors_rejects_non_tensors():
    with pytest.raises(TypeError, match="'step' is a int"):
        tio.weights_for_safetensors({"step": 3})
