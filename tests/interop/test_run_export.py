"""transformer.interop.run_export (the work of scripts/export.py), called in-process with the
script's composed config."""

from __future__ import annotations

import pytest

from tests.generation.helpers import compose_script_config, make_run_dir
from transformer.generation import LoadError
from transformer.interop import ExportError, run_export


def _cfg(*overrides: str):
    return compose_script_config("export", list(overrides))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("run_export") / "run")


def test_a_ctranslate2_export_names_what_it_wrote(run, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    out = run_export(_cfg(f"run={run[0]}", "format=ctranslate2", f"out={tmp_path / 'ct2'}", "quantization=int8"))
    assert out == tmp_path / "ct2" and (out / "model.bin").is_file()
    assert capsys.readouterr().err == f"wrote {out} (format=ctranslate2)\n"
    with pytest.raises(ExportError, match="already exists: choose another out= or pass force=true"):
        run_export(_cfg(f"run={run[0]}", "format=ctranslate2", f"out={out}"))
    assert run_export(_cfg(f"run={run[0]}", "format=ctranslate2", f"out={out}", "force=true")) == out


def test_refusals_write_nothing(run, tmp_path):
    with pytest.raises(ExportError, match="^quantization applies to format=ctranslate2 only$"):
        run_export(_cfg(f"run={run[0]}", "format=zoo", f"out={tmp_path / 'zoo'}", "quantization=int8"))
    with pytest.raises(ExportError, match="quantization=int8 applies to format=ctranslate2 only"):
        run_export(_cfg(f"run={run[0]}", "format=hf", f"out={tmp_path / 'hf'}", "quantization=int8"))
    with pytest.raises(ExportError, match=r"format='onnx' is not one of hf, ctranslate2"):
        run_export(_cfg(f"run={run[0]}", "format=onnx", f"out={tmp_path / 'onnx'}"))
    with pytest.raises(LoadError, match="checkpoint not found"):
        run_export(_cfg(f"run={tmp_path / 'no_run'}", "format=hf", f"out={tmp_path / 'hf'}"))
    assert list(tmp_path.iterdir()) == []
