"""train.compile=true on its real backend, inductor (C++ code generation on the CPU): a few updates
of the decoder-only model in one process, and of the encoder-decoder under 2-rank FSDP2, log eager's
losses and end at eager's weights within fp32 tolerance, and each graph is compiled once (no
recompilation after a first batch whose source and target lengths coincide) and traced once. 2-rank
DDP compiles its engine whole: its graphs are checked on dynamo's ``eager`` backend (graph breaks,
restarts; inductor's code for the same step is the one-process test's).

The options with their own ``autograd.Function`` are in the decoder-only model: the fused output
layer and loss, RMSNorm, rotary embeddings, a mixture of experts and dropout. Dropout draws
differently under compile: eager's CPU path draws its mask with an in-place ``random_`` (which
dynamo cannot trace), the compiled step uses ``F.dropout``, and inductor draws with its own
generator. The eager reference here takes ``F.dropout`` too and inductor falls back to eager's
generator (``fallback_random``), so both draw the same masks. Compiling costs tens of seconds per
graph on a CPU: one layer per stack, one compile thread (no pool of compile workers for a few small
kernels), few updates. The ``eager``-backend tests of the compiled step (graphs, recompilations, the
encoder-decoder's first batch of equal lengths): ``tests/training/step/test_compile.py``."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._inductor import cpp_builder
from torch._inductor.exc import InvalidCxxCompiler

from tests.conftest import REPO_ROOT, torchrun_command
from tests.training.conftest import small_cli_args, small_config
from tests.training.step.test_compile import _lengths_coincide
from transformer.data.dataset import load_translation_data
from transformer.training.checkpoint import load_checkpoint
from transformer.training.distributed.process_group import DistInfo
from transformer.training.loop.trainer import Trainer
from transformer.training.step import compiled
from transformer.training.step.update_stats import read_stats

pytestmark = pytest.mark.slow  # inductor compiles for tens of seconds per graph on a CPU

dropout_kernel = importlib.import_module("transformer.kernels.dropout")  # the package exports the function `dropout`

UPDATES = 3
CASES = {
    "decoder_only_rmsnorm_rotary_moe": (
        "model=llama_style_tiny",
        "model.n_decoder_layers=1",
        "model.d_model=32",
        "model.n_heads=4",
        "model.d_ff=64",
        "model/ffn=moe",
        "model.ffn.n_experts=4",
        "model.ffn.top_k=2",
    ),
}


def _cxx_or_skip() -> str:
    """The C++ compiler inductor would call (``torch._inductor.config.cpp.cxx``), or a skip that says so."""
    try:
        return cpp_builder.get_cpp_compiler()
    except InvalidCxxCompiler as err:
        pytest.skip(f"inductor has no C++ compiler to generate CPU code with: {err}")


@pytest.fixture
def inductor(monkeypatch):
    _cxx_or_skip()
    monkeypatch.setattr(compiled, "BACKEND", "inductor")
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    with inductor_config.patch(compile_threads=1, fallback_random=True):
        yield
    torch.compiler.reset()


def _batches(trainer: Trainer) -> list:
    """``UPDATES`` batches of the first epoch, of more than one row: first one whose source and target
    lengths coincide (duck sizing's case), then ones where they differ (encoder-decoder)."""
    epoch = [b for _, b in zip(range(len(trainer.sampler)), trainer.batches()) if b.target.shape[0] > 1]
    first = next(b for b in epoch if _lengths_coincide(b))
    return [first, *sorted((b for b in epoch if b is not first), key=_lengths_coincide)[: UPDATES - 1]]


def _trained(corpus: Path, run: Path, overrides: tuple[str, ...]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """``UPDATES`` updates of a fresh trainer (:func:`_batches`): the logged numbers of each and the
    final weights."""
    cfg = small_config(corpus, run, *overrides)
    trainer = Trainer(cfg, load_translation_data(cfg.data), DistInfo(0, 1, torch.device("cpu")), run)
    logged = [read_stats(trainer.train_step([batch])) for batch in _batches(trainer)]
    return logged, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("case", CASES)
def test_inductor_trains_as_eager(small_corpus, tmp_path, monkeypatch, inductor, case):
    overrides = (*CASES[case], "model.dropout=0.1", "optim.eps=1e-6", "train.pad_to_multiple=8")
    with monkeypatch.context() as eager_dropout:  # the masks F.dropout draws, as the compiled step
        eager_dropout.setattr(dropout_kernel, "_use_fast_path", lambda *args: False)
        eager_logged, eager_weights = _trained(small_corpus, tmp_path / "eager", overrides)
    logged, weights = _trained(small_corpus, tmp_path / "compiled", (*overrides, "train.compile=true"))
    counters = torch._dynamo.utils.counters
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert compiled.compiled_graphs() == 1  # no recompilation (duck sizing)
    # traced once (a Python float traced as a symbol made dynamo restart and trace the step twice)
    assert counters["aot_autograd"]["total"] == 1, dict(counters["aot_autograd"])
    assert counters["inductor"], "inductor compiled nothing"
    for update, (ours, ref) in enumerate(zip(logged, eager_logged), 1):
        assert ours["ntokens"] == ref["ntokens"]
        for key in ("loss", "nll_loss", "grad_norm"):
            assert ours[key] == pytest.approx(ref[key], rel=1e-5), f"update {update}: {key}"
    for name, ref in eager_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)


def _torchrun(args: list[str], backend: str, probe_out: Path) -> subprocess.CompletedProcess:
    """``scripts/train.py`` under 2-rank torchrun through ``tests/training/rank_probe.py``, compiling
    (when ``train.compile=true``) with ``backend``."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "TORCH_LOGS": "graph_breaks,dynamo",
        "PROBE_COMPILE_BACKEND": backend,
        "PROBE_OUT": str(probe_out),
    }
    return subprocess.run(
        torchrun_command("tests/training/rank_probe.py", *args),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


@pytest.mark.parametrize(("distributed", "backend"), [("ddp", "eager"), ("fsdp", "inductor")])
def test_two_process_compiled_step_trains_as_eager(small_corpus, tmp_path, distributed, backend):
    """DDP compiles its engine whole: graph breaks only in DDP's own frames around the model's
    forward (no operation of ours in them). FSDP2 compiles each layer's forward: no graph break (the
    whole engine broke at every FSDP2 hook), through inductor. Each graph is traced once."""
    if backend == "inductor":
        _cxx_or_skip()
    common = [
        f"train.distributed={distributed}",
        "model.n_encoder_layers=1",  # one layer of each: inductor's C++ compile time grows with the kernels
        "model.n_decoder_layers=1",
        "model.dropout=0.0",  # eager's and the compiled step's dropout masks differ (module docstring)
        f"train.max_updates={UPDATES}",
        "train.validate_every=0",
        "train.valid_bleu=false",
        "data.test_splits=[]",
        "optim.eps=1e-6",
    ]
    runs = {"eager": tmp_path / "eager", "compiled": tmp_path / "compiled"}
    for name, run in runs.items():
        out = _torchrun(
            small_cli_args(
                small_corpus, run, *common, f"train.compile={str(name == 'compiled').lower()}", f"hydra.run.dir={run}"
            ),
            backend,
            tmp_path / f"probe_{name}",
        )
        assert out.returncode == 0, out.stderr[-3000:]
    breaks = re.findall(r"Graph break .*?in user code at (\S+)", out.stderr)
    if distributed == "ddp":
        breaks = [at for at in breaks if not re.search(r"torch/nn/parallel/distributed\.py|contextlib\.py", at)]
    assert not breaks, breaks
    # no graph traced twice (a Python float traced as a symbol, specialised after the first trace)
    assert not re.search(r"Restarting analysis due to \S*tensorify", out.stderr)
    assert _losses(runs["compiled"]) == pytest.approx(_losses(runs["eager"]), rel=1e-5)
    eager, ours = (load_checkpoint(run, "checkpoint_last")[0] for run in runs.values())
    assert ours.keys() == eager.keys()
    for name in eager:
        torch.testing.assert_close(ours[name], eager[name], atol=1e-5, rtol=0, msg=name)
