"""Where tensors and devices come from (transformer/device.py).

* :func:`~transformer.device.resolve_device` is the one helper that turns ``train.device`` /
  ``device`` into a device, for the trainer, decoding and the loaders;
* every tensor factory call of the package (``torch.arange``, ``torch.zeros``, ``torch.tensor``, ...)
  names its ``device=``, unless it sits in a function of :data:`HOST_FACTORIES`, which make their
  tensors on the host on purpose (the data pipeline, tables and parameters made at construction and
  moved with the module, exports). A forward pass or a decoding step that made ``torch.arange(n)``
  without ``device=`` would put a CPU tensor in the GPU path: this test names the line;
  ``tests/test_fake_cuda.py`` catches what reaches an operator.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
import torch

import transformer
from tests.conftest import REPO_ROOT
from transformer.device import resolve_device
from transformer.generation import loading
from transformer.training.distributed import process_group
from transformer.training.job import finished_runs

PACKAGE = Path(transformer.__file__).parent

FACTORIES = {
    "arange",
    "as_tensor",
    "empty",
    "empty_strided",
    "eye",
    "from_numpy",
    "frombuffer",
    "full",
    "Generator",
    "linspace",
    "logspace",
    "normal",
    "ones",
    "rand",
    "randint",
    "randn",
    "randperm",
    "scalar_tensor",
    "tensor",
    "tril_indices",
    "triu_indices",
    "zeros",
}
"""``torch.<name>(...)`` calls that make a tensor (or a generator) on the default device unless given ``device=``."""

HOST_FACTORIES: dict[tuple[str, str], str] = {
    ("generation/beam.py", "_beam_search"): "length penalties and parent rows made on the host from host values, then "
    "copied to the device without waiting (one read a step)",
    ("generation/common.py", "to_device"): "host ints to a device tensor: made on the host, copied non_blocking",
    ("models/state.py", "DecodingState._reorder_sources"): "the rows to keep, from the host's index copy, then "
    "copied to the index's device non_blocking",
    ("modules/rope_scaling.py", "rope_inv_freq"): "the RoPE frequency table, built at construction and moved "
    "with the module (a plugin's from_sizes returns host values)",
    ("data/batching.py", "TokenBatchSampler._epoch"): "the data order, drawn on the host",
    ("data/collate.py", "pad_sequences"): "batches are built on the host, then Batch.to(device)",
    ("data/collate.py", "_ids_tensor"): "batches are built on the host, then Batch.to(device)",
    ("data/collate.py", "_one_buffer"): "batches are built on the host, then Batch.to(device)",
    ("data/collate.py", "collate_encoder_decoder"): "batches are built on the host, then Batch.to(device)",
    ("data/collate.py", "collate_decoder_only"): "batches are built on the host, then Batch.to(device)",
    (
        "generation/translate.py",
        "make_src_tokens",
    ): "the source batch is built on the host, then moved with one .to(device)",
    ("interop/ct2.py", "_position_table"): "an export, on the host",
    ("interop/hf_marian.py", "marian_permutation"): "an export, on the host",
    ("interop/hf_marian.py", "marian_state"): "an export, on the host",
    ("interop/hf_marian.py", "marian_state.linear"): "an export, on the host",
    ("interop/hf_moe_import.py", "_half_split"): "an export, on the host",
    ("modules/moe_router.py", "TopKRouter.__init__"): "a buffer made at construction, moved with the module",
    ("modules/moe.py", "GroupedExperts.__init__"): "parameters made at construction, moved with the module",
    (
        "modules/positions.py",
        "LearnedPositionalEmbedding.__init__",
    ): "a parameter made at construction, moved with the module",
    ("modules/positions.py", "sinusoidal_table"): "an fp32 table made at construction: PositionEncoding._fp32 "
    "moves it on first use, a grown one goes to the old one's device",
    ("modules/positions.py", "alibi_slopes"): "an fp32 table made at construction (PositionEncoding._fp32 moves it)",
    (
        "modules/rope_scaling.py",
        "unscaled_inv_freq",
    ): "RoPE frequencies made at construction (PositionEncoding._fp32 moves them)",
    ("modules/rope_scaling.py", "_yarn"): "RoPE frequencies made at construction (PositionEncoding._fp32 moves them)",
    ("training/checkpoint/rng.py", "get_rng_state"): "the host's generator states, saved in the training state",
}
"""(file under ``transformer/``, function) -> why its tensor factories need no ``device=``."""

HOST_MODULES: dict[str, str] = {
    "testing/models.py": "the module-check kit: tiny CPU models fed inputs it makes on the host (not a GPU path)",
    "testing/checks.py": "the module-check kit: tiny CPU models fed inputs it makes on the host (not a GPU path)",
    "testing/compiles.py": "the module-check kit: tiny CPU models fed inputs it makes on the host (not a GPU path)",
    "testing/schedules.py": "the module-check kit: tiny CPU models fed inputs it makes on the host (not a GPU path)",
}
"""Files under ``transformer/`` whose tensors are all made on the host on purpose, and why."""

DEVICE_CHOICES: dict[str, str] = {
    "device.py": "resolve_device: the one place that picks a device from a name",
    "precision.py": "cuda_has_fast_bf16: whether a CUDA device torch sees multiplies bf16 natively",
    "training/checkpoint/rng.py": "saves and restores the GPU's generator states when there is one",
}
"""Files under ``transformer/`` that may call ``torch.cuda.is_available()``, and why."""


@functools.lru_cache(maxsize=1)
def _calls() -> list[tuple[str, str, int, ast.Call]]:
    """``(file, function qualname, line, call)`` of every call in the package."""
    out = []

    def visit(rel: str, node: ast.AST, scope: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = (*scope, node.name)
        if isinstance(node, ast.Call):
            out.append((rel, ".".join(scope), node.lineno, node))
        for child in ast.iter_child_nodes(node):
            visit(rel, child, scope)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")), ())
    return out


def _torch_call(call: ast.Call) -> str | None:
    """``name`` of a ``torch.<name>(...)`` call (``torch.cuda.<name>`` as ``cuda.<name>``), else None."""
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch":
        return f.attr
    if (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Attribute)
        and isinstance(f.value.value, ast.Name)
        and f.value.value.id == "torch"
    ):
        return f"{f.value.attr}.{f.attr}"
    return None


def test_every_tensor_factory_names_its_device_outside_host_functions() -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for rel, scope, line, call in _calls():
        name = _torch_call(call)
        if rel in HOST_MODULES:
            continue
        if name in FACTORIES and not any(k.arg == "device" for k in call.keywords):
            found.setdefault((rel, scope), []).append(f"transformer/{rel}:{line} torch.{name}")
    unexplained = [site for key, sites in found.items() if key not in HOST_FACTORIES for site in sites]
    assert not unexplained, (
        "tensors made without device= (on the CPU, whatever device the inputs are on); pass "
        "device=<an input>.device (or use x.new_*/torch.*_like), or, for a tensor made on the host on "
        "purpose, list the function in HOST_FACTORIES with the reason:\n" + "\n".join(unexplained)
    )
    stale = sorted(set(HOST_FACTORIES) - set(found))
    assert not stale, f"HOST_FACTORIES entries that make no tensor without device= any more: {stale}"


def test_no_module_moves_tensors_with_cuda_or_picks_a_device_itself() -> None:
    cuda_calls = [
        f"transformer/{rel}:{line}"
        for rel, _, line, call in _calls()
        if isinstance(call.func, ast.Attribute) and call.func.attr == "cuda" and not call.args
    ]
    assert not cuda_calls, f".cuda() moves to the current GPU whatever train.device says; use .to(device): {cuda_calls}"
    asking = {rel for rel, _, _, call in _calls() if _torch_call(call) == "cuda.is_available"}
    assert asking <= set(DEVICE_CHOICES), (
        f"modules asking torch.cuda.is_available() to choose a device: {sorted(asking - set(DEVICE_CHOICES))}; "
        "use transformer.device.resolve_device"
    )
    assert {"device.py"} <= asking


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device(None) == resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda") == torch.device("cuda", 0)  # an index, so that it equals tensors' devices
    assert resolve_device("cuda:1") == resolve_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 3)
    monkeypatch.setenv("LOCAL_RANK", "2")  # torchrun: each rank its GPU
    assert resolve_device("cuda") == torch.device("cuda", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda", 2)
    with pytest.raises(RuntimeError):
        resolve_device("gpu")


def test_a_cuda_device_where_torch_sees_none_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """``device=cuda`` (translate.py, evaluate.py) and ``train.device=cuda`` on a machine without a
    GPU stop with a ConfigError naming the field, before any model is loaded or any work is done."""
    from tests.generation.helpers import compose_script_config
    from transformer.config import ConfigError
    from transformer.device import unavailable
    from transformer.evaluation.command import evaluate_checkpoint
    from transformer.generation import translate_file
    from transformer.training.distributed.process_group import setup_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert unavailable(torch.device("cpu"), "device") is None
    assert unavailable(torch.device("cuda", 0), "train.device").startswith(
        "train.device=cuda: torch sees no CUDA device on this machine"
    )
    missing = tmp_path / "not_loaded"  # never read: the device is refused first
    for run, script in ((translate_file, "translate"), (evaluate_checkpoint, "evaluate")):
        with pytest.raises(ConfigError, match=r"^device=cuda: torch sees no CUDA device .* use device=cpu"):
            run(compose_script_config(script, [f"checkpoint={missing}", "device=cuda"]))
    with pytest.raises(ConfigError, match=r"^train\.device=cuda: torch sees no CUDA device"):
        setup_distributed("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert unavailable(torch.device("cuda", 0), "device") is None


def test_trainer_decoding_and_loaders_use_resolve_device() -> None:
    """The trainer's device (``setup_distributed``), a finished run's, ``translate.py``'s and
    ``evaluate.py``'s (``transformer.generation.resolve_device``) and ``load_run``'s come from it."""
    assert loading.resolve_device is resolve_device
    for module in (process_group, finished_runs, loading):
        assert "resolve_device(" in Path(module.__file__).read_text(encoding="utf-8"), module.__name__
    source = (REPO_ROOT / "transformer" / "training" / "distributed" / "process_group.py").read_text(encoding="utf-8")
    assert "torch.device(" not in source
