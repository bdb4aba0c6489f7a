"""train.compile=true: the whole training step of a micro-batch (forward, fused loss, router losses,
backward) is compiled without a graph break, computes eager's loss and gradients, and an epoch of
token batches compiles one graph: shapes are dynamic and compiled without duck sizing, so a first
batch whose source and target lengths coincide does not compile a graph guarded on their equality
(the next batch where they differ would compile a second); a batch of one row compiles its own
graph the first time (sizes 0 and 1 are always specialised). Duck sizing and its guards are
dynamo's, before any backend: the ``eager`` backend runs dynamo's capture, guards and
recompilations without AOTAutograd or code generation, the cheapest backend that shows them
(``aot_eager`` and ``inductor`` add no guard here: the same counts). Inductor's numerics:
``tests/training/step/test_compile_inductor.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.training.conftest import small_config
from transformer.data.dataset import load_translation_data
from transformer.training.distributed.process_group import DistInfo
from transformer.training.job.run import train
from transformer.training.loop.trainer import Trainer, TrainingError
from transformer.training.step import compiled

CASES = {
    "encoder_decoder": (),
    "decoder_only_moe": (
        "model=llama_style_tiny",
        "model.n_decoder_layers=2",
        "model.d_model=32",
        "model.d_ff=64",
        "model/ffn=moe",
        "model.ffn.n_experts=4",
        "model.ffn.top_k=2",
    ),
}


def _trainer(corpus: Path, run: Path, *overrides: str) -> Trainer:
    cfg = small_config(corpus, run, "model.dropout=0.0", "train.pad_to_multiple=8", *overrides)
    return Trainer(cfg, load_translation_data(cfg.data), DistInfo(0, 1, torch.device("cpu")), run)


def _shape(batch) -> tuple:
    return tuple(tuple(t.shape) for t in (*batch.net_input.values(), batch.target))


def _lengths_coincide(batch) -> bool:
    """Every length of the batch equal (the source's and the target's): duck sizing's case."""
    return len({t.shape[1] for t in (*batch.net_input.values(), batch.target)}) == 1


@pytest.mark.parametrize("case", CASES)
def test_an_epoch_compiles_one_graph_without_graph_breaks(small_corpus, tmp_path, monkeypatch, case):
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    eager = _trainer(small_corpus, tmp_path / "eager", *CASES[case])
    trainer = _trainer(small_corpus, tmp_path / "compiled", "train.compile=true", *CASES[case])
    assert isinstance(trainer.parallel.engine, torch._dynamo.eval_frame.OptimizedModule)
    epoch = [batch for _, batch in zip(range(len(trainer.sampler)), trainer.batches())]
    # the first compilation sees a batch whose source and target lengths coincide
    first = next(i for i, batch in enumerate(epoch) if _lengths_coincide(batch) and batch.target.shape[0] > 1)
    epoch.insert(0, epoch.pop(first))
    shapes = {_shape(batch) for batch in epoch}
    for update, batch in enumerate(epoch):
        if update < 2:  # the compiled loss and gradients of a micro-batch are eager's (same weights)
            eager.model.load_state_dict(trainer.model.state_dict())
            for t in (eager, trainer):
                t.model.train()
                t.model.zero_grad(set_to_none=True)
            ours, ref = trainer.micro_loss(batch), eager.micro_loss(batch)
            for key in ("loss", "nll_loss", "ntokens", *(("router_loss",) if "router_loss" in ref else ())):
                torch.testing.assert_close(
                    torch.as_tensor(ours[key]).double(),
                    torch.as_tensor(ref[key]).double(),
                    rtol=1e-5,
                    atol=1e-5,
                    msg=key,
                )
            ours["loss"].backward()
            ref["loss"].backward()
            for (name, a), b in zip(trainer.model.named_parameters(), eager.model.parameters()):
                if b.grad is not None:
                    torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
        trainer.train_step([batch])
    counters = torch._dynamo.utils.counters
    graphs = compiled.compiled_graphs()
    one_row = any(batch.target.shape[0] == 1 for batch in epoch)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert len(shapes) >= 5  # an epoch of token batches: many shapes
    assert graphs == 1 + one_row, f"{graphs} compilations for {len(shapes)} batch shapes ({one_row=})"
    print(f"{case}: {len(epoch)} updates, {len(shapes)} distinct batch shapes, {graphs} compiled graphs ({one_row=})")


def test_compile_auto_is_eager_on_a_cpu_and_compiled_elsewhere(small_corpus, tmp_path):
    """``train.compile=auto`` (the default) resolves by device (the fake-CUDA dry run shows CUDA's
    side through the Trainer, ``tests/test_fake_cuda.py``); a run records what it resolved to."""
    assert [compiled.resolve_compile(v, d) for v, d in (("auto", "cpu"), ("auto", "cuda"), ("auto", "xpu"))] == [
        False,
        True,
        True,
    ]
    assert compiled.resolve_compile(True, "cpu") is True and compiled.resolve_compile(False, "cuda") is False
    with pytest.raises(ValueError, match="train.compile='yes' is not one of auto, true, false"):
        compiled.resolve_compile("yes", "cpu")
    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.max_updates=1", "train.validate_every=0", "train.valid_bleu=false")
    assert cfg.train.compile == "auto"
    train(cfg)
    assert OmegaConf.load(run / "config.yaml").train.compile is False
    assert "eager (train.compile=false)" in (run / "train.log").read_text()


def test_a_step_that_fails_to_compile_stops_the_run_in_one_line_with_no_checkpoint(small_corpus, tmp_path, monkeypatch):
    def no_compiler(gm, example_inputs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(compiled, "BACKEND", no_compiler)
    run = tmp_path / "run"
    cfg = small_config(small_corpus, run, "train.compile=true", "train.max_updates=2", "train.save_every=1")
    with pytest.raises(TrainingError) as err:
        train(cfg)
    message = str(err.value)
    assert "\n" not in message and "no C++ compiler found" in message and "train.compile=false" in message
    assert message.startswith("train.compile: the training step failed to compile (BackendCompilerFailed")
    assert not list(run.glob("checkpoint*"))
