"""The module checks (incremental decoding, padding, search batching, causality, gradients, bf16,
compiling: :data:`CHECKS`), :func:`check_model` running them on a built model and :func:`check_option`
on both families with an option chosen."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from transformer.config import GROUPS
from transformer.generation import beam_search, greedy_search
from transformer.plugins import import_plugins
from transformer.testing.compiles import check_compiles
from transformer.testing.models import ARCHS, EOS, PAD, V, _close, _forward, _source_batch, _src_rows, tiny_model
from transformer.testing.schedules import check_schedule

__all__ = [
    "CHECKS",
    "check_bf16",
    "check_causality",
    "check_gradients",
    "check_incremental_decoding",
    "check_model",
    "check_option",
    "check_padding",
    "check_search_batching",
]


def check_incremental_decoding(model: nn.Module) -> None:
    """The KV-cached steps equal the full forward at every target step, for sources of lengths 6, 3, 5."""
    rows, tgt = _src_rows([6, 3, 5]), torch.randint(5, V, (3, 6))
    start = model.decoder_start_token_id
    with torch.no_grad():
        expected = torch.stack(
            [
                _forward(model, r[None], torch.cat([torch.tensor([[start]]), tgt[b : b + 1, :-1]], 1))[0]
                for b, r in enumerate(rows)
            ]
        )
        state = model.start_decoding(_source_batch(model, rows))
        prev, steps = torch.full((3, 1), start), []
        for t in range(tgt.shape[1]):
            steps.append(model.decode_step(prev, state))
            prev = tgt[:, t : t + 1]
    _close(
        torch.stack(steps, 1),
        expected,
        "incremental decoding (start_decoding + decode_step) differs from the full forward",
    )


def check_padding(model: nn.Module) -> None:
    """Padding the source and target, or batching with a longer neighbour, leaves a sentence's logits."""
    src, prev = (
        torch.randint(5, V, (1, 5)),
        torch.cat([torch.tensor([[model.decoder_start_token_id]]), torch.randint(5, V, (1, 3))], 1),
    )
    with torch.no_grad():
        ref = _forward(model, src, prev)
        if model.arch == "encoder_decoder":
            src_pad = torch.cat([src, torch.full((1, 1), EOS), torch.full((1, 3), PAD)], 1)
            padded = model(src_pad, torch.cat([prev, torch.full((1, 2), PAD)], 1))[:, : prev.shape[1]]
            other = torch.cat([torch.randint(5, V, (1, 8)), torch.full((1, 1), EOS)], 1)
            batched = model(torch.cat([src_pad[:, :9], other], 0), torch.cat([prev, torch.randint(5, V, (1, 4))], 0))[
                :1
            ]
        else:
            seq = torch.cat([src, prev], 1)
            padded = model(torch.cat([seq, torch.full((1, 3), PAD)], 1))[:, src.shape[1] : seq.shape[1]]
            batched = ref  # a decoder-only row holds source and target: batching is the search check's
    _close(padded, ref, "padding a sentence changes its logits")
    _close(batched, ref, "batching a sentence with a longer one changes its logits")


def check_search_batching(model: nn.Module) -> None:
    """Greedy and beam search of a batch equal each sentence decoded alone (lengths 7, 2, 4)."""
    rows = _src_rows([7, 2, 4])
    limits = dict(max_len_a=1.0, max_len_b=4, min_len=1, length_penalty_alpha=1.0)
    for name, search in (
        ("greedy", lambda s: greedy_search(model, s, **limits)),
        ("beam", lambda s: beam_search(model, s, beam_size=3, nbest=1, **limits)),
    ):
        batch = [h[0].tokens for h in search(_source_batch(model, rows))]
        alone = [search(_source_batch(model, [r]))[0][0].tokens for r in rows]
        if [list(map(int, t)) for t in batch] != [list(map(int, t)) for t in alone]:
            raise AssertionError(f"{name} search of a padded batch gives other hypotheses than each sentence alone")


def check_causality(model: nn.Module) -> None:
    """Changing target tokens from position 5 on leaves the logits of positions 0-4 unchanged."""
    src, tgt = torch.randint(5, V, (2, 6)), torch.randint(5, V, (2, 8))
    other = tgt.clone()
    other[:, 5:] = torch.randint(5, V, (2, 3))
    with torch.no_grad():
        a, b = _forward(model, src, tgt), _forward(model, src, other)
    _close(a[:, :5], b[:, :5], "a later target token changes an earlier position's logits (the future leaks)")
    if not (a[:, 5:] - b[:, 5:]).abs().max() > 1e-6:
        raise AssertionError("changing target tokens changes no logits at all (is the decoder input read?)")


def _loss(model: nn.Module) -> Tensor:
    src, tgt = torch.randint(5, V, (3, 6)), torch.randint(5, V, (3, 6))
    src[2, 4:] = PAD
    logits = _forward(model, src, tgt)
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.roll(-1, 1).reshape(-1))


def check_gradients(model: nn.Module) -> None:
    """One training loss's backward gives every trainable parameter a finite gradient."""
    model.train()
    try:
        model.zero_grad(set_to_none=True)
        _loss(model).backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    if missing or bad:
        raise AssertionError(f"parameters without a gradient: {missing[:5]}; with a non-finite one: {bad[:5]}")


def check_bf16(model: nn.Module) -> None:
    """Forward and backward under ``torch.autocast("cpu", torch.bfloat16)`` stay finite."""
    model.train()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = _loss(model)
        loss.backward()
        finite = torch.isfinite(loss).item() and all(
            torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
        )
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    if not finite:
        raise AssertionError("bf16 autocast gives a non-finite loss or gradient")


CHECKS: dict[str, Callable[[nn.Module], None]] = {
    "incremental_decoding": check_incremental_decoding,
    "padding": check_padding,
    "search_batching": check_search_batching,
    "causality": check_causality,
    "gradients": check_gradients,
    "bf16": check_bf16,
    "compiles": check_compiles,
}
"""Every check of the kit, by name."""


def check_model(model: nn.Module, checks: Iterable[str] = CHECKS) -> None:
    """Run the named checks (default all) on a built model, naming the check in the error."""
    for name in checks:
        try:
            CHECKS[name](model)
        except AssertionError as err:
            raise AssertionError(f"[{name}, {model.arch}] {err}") from None


def check_option(
    switch: str | None = None,
    name: str | None = None,
    *,
    plugins: Iterable[str] = (),
    archs: Iterable[str] = ARCHS,
    checks: Iterable[str] = CHECKS,
    options: dict[str, str] | None = None,
    **fields: Any,
) -> None:
    """Every check on both families with ``switch=name`` chosen (and ``options``, ``fields`` as in
    :func:`tiny_model`), after importing ``plugins``.

    Raises:
        AssertionError: a check failed (the message names it and the family).
        PluginError: a plugin that cannot be imported.
        ConfigError: an invalid combination.
    """
    import_plugins(plugins)
    if switch == "lr_scheduler":
        check_schedule(str(name), **fields)
        return
    chosen = dict(options or {})
    if switch is not None:
        if switch in GROUPS:
            chosen[switch] = name
        else:
            fields[switch.removeprefix("model.")] = name
    for arch in archs:
        model, _ = tiny_model(arch, chosen, **fields)
        check_model(model, checks)
