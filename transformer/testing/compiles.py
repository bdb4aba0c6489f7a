"""The compile check: :func:`check_compiles` traces the training loss and decoding's step with
``torch.compile(fullgraph=True)`` and holds them to eager's values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from transformer.testing.models import EOS, PAD, _close, _source_batch, _src_rows
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss

__all__ = ["check_compiles"]


def _counting(backend: str, graphs: list[Any]) -> Callable[..., Any]:
    """A ``torch.compile`` backend that records each graph it receives, then hands it to ``backend``."""
    inner = torch._dynamo.lookup_backend(backend)

    def compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(gm)
        return inner(gm, example_inputs)

    return compiler


def _compiled(fn: Callable[..., Any], what: str, backend: str, *args: Any) -> Any:
    """``fn(*args)`` through ``torch.compile(fullgraph=True)``, raising AssertionError on a graph break
    (or anything else the compiler refuses) and when no graph was compiled."""
    graphs: list[Any] = []
    try:
        out = torch.compile(fn, fullgraph=True, backend=_counting(backend, graphs))(*args)
    except Exception as err:  # the eager call before passed: what fails here is the compiler's
        reason = " ".join(str(err).split("\n")[0].split())[:300]
        raise AssertionError(
            f"{what} does not compile in one graph (torch.compile fullgraph=True): {type(err).__name__}: {reason}"
        ) from None
    if not graphs:
        raise AssertionError(f"{what}: torch.compile compiled no graph (a recompile limit reached?)")
    return out


def _training_batch(model: nn.Module) -> tuple[dict[str, Tensor], Tensor]:
    """A right-padded training batch as the collator makes it, sources of 6, 3 and 5 tokens and
    targets of 5, 3 and 5 tokens (+ EOS): ``(net_input, target)``; a decoder-only row is ``source
    SEP target`` with no loss over the source."""
    rows, tgts = _src_rows([6, 3, 5]), [torch.cat([r, torch.tensor([EOS])]) for r in _src_rows([5, 3, 5])]
    start = torch.tensor([model.decoder_start_token_id])

    def padded(seqs: list[Tensor]) -> Tensor:
        out = torch.full((len(seqs), max(len(q) for q in seqs)), PAD)
        for b, q in enumerate(seqs):
            out[b, : len(q)] = q
        return out

    if model.arch == "encoder_decoder":
        prev = padded([torch.cat([start, t[:-1]]) for t in tgts])
        return {"src_tokens": _source_batch(model, rows), "prev_output_tokens": prev}, padded(tgts)
    tokens = padded([torch.cat([r, start, t[:-1]]) for r, t in zip(rows, tgts)])
    return {"tokens": tokens}, padded([torch.cat([torch.full_like(r, PAD), t]) for r, t in zip(rows, tgts)])


def check_compiles(model: nn.Module) -> None:
    """``torch.compile(fullgraph=True)`` traces, each in one graph (no graph break), the training
    step's forward and loss (:func:`~transformer.training.step.criterion.model_loss`: the fused output
    layer and label-smoothed loss, a mixture of experts' router losses; an ``autograd.Function``'s
    backward is traced with it) and decoding's per-step function (``decode_step`` with the KV
    cache; the encoder-decoder's first step, which fills the cross-attention caches, and its
    second, whose key length dynamo then traces as dynamic); the compiled loss, gradients and
    logits equal eager's. ``backend="eager"`` (dynamo's tracing without code generation: seconds on
    a CPU); ``torch.compiler.reset()`` first, so that earlier models' compilations count against no
    recompile limit. Expects a model without dropout (the kit's tiny models)."""
    torch.compiler.reset()
    criterion = LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
    net_input, target = _training_batch(model)

    def objective(net_input: dict[str, Tensor], target: Tensor) -> Tensor:
        out = model_loss(model, criterion, net_input, target)
        return (out["loss"] + out["router_loss"] if "router_loss" in out else out["loss"]) / out["ntokens"]

    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    model.train()
    try:
        expected = objective(net_input, target)
        expected_grads = torch.autograd.grad(expected, params, allow_unused=True)
        got = _compiled(objective, "the training loss (model_loss)", "eager", net_input, target)
        grads = torch.autograd.grad(got, params, allow_unused=True)
    finally:
        model.eval()
    _close(got.detach(), expected.detach(), "the compiled training loss differs from eager")
    for (name, _), a, b in zip(named, grads, expected_grads):
        if (a is None) != (b is None):
            raise AssertionError(f"{name}: a gradient in one of eager and compiled training only")
        if a is not None:
            _close(a, b, f"the compiled training gradient of {name} differs from eager")
    rows = _src_rows([6, 3, 5])
    with torch.no_grad():
        eager_state, state = (
            model.start_decoding(_source_batch(model, rows)),
            model.start_decoding(_source_batch(model, rows)),
        )
        prev = torch.full((3, 1), model.decoder_start_token_id)
        for step in range(2 if model.arch == "encoder_decoder" else 1):
            expected = model.decode_step(prev, eager_state)
            got = _compiled(model.decode_step, f"decode_step (step {step + 1}, KV cache)", "eager", prev, state)
            _close(got, expected, f"the compiled decode_step (step {step + 1}) differs from eager")
            prev = expected.argmax(-1, keepdim=True)
