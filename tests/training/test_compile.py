"""train.compile=true (issue 44, items 2 and 3): the whole training step of a micro-batch (forward,
fused loss, router losses, backward) is compiled without a graph break, computes eager's loss and
gradients, and an epoch of token batches compiles at most once per distinct batch shape (the
shapes being dynamic: one graph, plus a recompilation where the first batch's source and target
lengths were equal (dynamo's duck sizing took them for one symbol) and one for a batch of one row
(sizes 0 and 1 are always specialised)). The ``eager`` backend runs dynamo's capture, guards and
recompilations as the inductor would, without code generation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.training.conftest import small_config
from transformer.data.dataset import load_translation_data
from transformer.training.distributed.process_group import DistInfo
from transformer.training.loop.trainer import Trainer
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


@pytest.mark.parametrize("case", CASES)
def test_an_epoch_compiles_once_per_shape_at_most_without_graph_breaks(small_corpus, tmp_path, monkeypatch, case):
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    eager = _trainer(small_corpus, tmp_path / "eager", *CASES[case])
    trainer = _trainer(small_corpus, tmp_path / "compiled", "train.compile=true", *CASES[case])
    assert isinstance(trainer.parallel.engine, torch._dynamo.eval_frame.OptimizedModule)
    batches = trainer._batches()
    shapes = set()
    for update in range(len(trainer.sampler)):  # one epoch
        batch = next(batches)
        shapes.add(_shape(batch))
        if update < 2:  # the compiled loss and gradients of a micro-batch are eager's (same weights)
            eager.model.load_state_dict(trainer.model.state_dict())
            for t in (eager, trainer):
                t.model.train()
                t.model.zero_grad(set_to_none=True)
            ours, ref = trainer._loss(batch), eager._loss(batch)
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
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert len(shapes) >= 5  # an epoch of token batches: many shapes
    assert 1 <= graphs <= len(shapes)
    assert graphs <= 3, f"{graphs} compilations for {len(shapes)} batch shapes (dynamic shapes: one to three)"
    print(f"{case}: {len(trainer.sampler)} updates, {len(shapes)} distinct batch shapes, {graphs} compiled graphs")
