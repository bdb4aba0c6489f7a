"""The export entry point and its all-or-nothing output folder (transformer.interop.export / common)."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_model_config
from tests.generation.helpers import make_run_dir
from transformer.interop import ExportError, export_run, hf_marian, unsupported
from transformer.interop.export_common import staging_dir


def test_staging_dir_renames_only_on_success(tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with staging_dir(out) as tmp:
            (tmp / "half.bin").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with staging_dir(out) as tmp:
        (tmp / "a").write_text("1")
    assert [p.name for p in out.iterdir()] == ["a"]
    with pytest.raises(ExportError, match="already exists"):
        with staging_dir(out):
            pass
    with staging_dir(out, force=True) as tmp:
        (tmp / "b").write_text("2")
    assert [p.name for p in out.iterdir()] == ["b"] and [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("export") / "run")


def test_failure_while_writing_leaves_nothing(run, tmp_path, monkeypatch) -> None:
    pytest.importorskip("transformers")

    def half_then_crash(model, cfg, toks, folder, run_cfg=None):
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(hf_marian, "save_marian", half_then_crash)
    with pytest.raises(OSError, match="disk full"):
        export_run(run[0], "hf", tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_refusals_come_before_any_output(tmp_path) -> None:
    pytest.importorskip("transformers")
    run_dir = make_run_dir(tmp_path / "run", **{"norm_position": "pre", "ffn.name": "swiglu"})[0]
    with pytest.raises(ExportError) as err:
        export_run(run_dir, "hf", tmp_path / "hf")
    msg = str(err.value)
    assert msg.startswith("cannot export to Hugging Face MarianMTModel: ")
    assert "model.norm_position=pre" in msg and "model/ffn=swiglu" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_bad_arguments(run, tmp_path) -> None:
    with pytest.raises(ExportError, match="format='onnx' is not one of hf, ctranslate2"):
        export_run(run[0], "onnx", tmp_path / "x")
    with pytest.raises(ExportError, match="quantization=int8 applies to format=ctranslate2 only"):
        export_run(run[0], "hf", tmp_path / "x", quantization="int8")
    (tmp_path / "x").mkdir()
    with pytest.raises(ExportError, match="already exists"):
        export_run(run[0], "hf", tmp_path / "x")
    with pytest.raises(ExportError, match="format='onnx'"):
        unsupported(tiny_model_config(), "onnx")
