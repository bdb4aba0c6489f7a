"""The zoo's module checks as a kit: the properties every option is held to, for any option of any
group, built-in or a plugin's (:mod:`transformer.registry`).

Each check builds a tiny model (``d_model`` 32, 4 heads of 8, two layers a stack, dropout 0) of a
family with the option chosen, and raises ``AssertionError`` with a sentence when the property
fails:

- :func:`check_incremental_decoding`: ``start_decoding`` + ``decode_step`` (the KV cache) gives the
  full forward's logits at every target position, for a batch of sources of different lengths;
- :func:`check_padding`: a sentence's logits do not change when it is padded, or batched with a
  longer neighbour;
- :func:`check_search_batching`: greedy and beam search of a batch of sentences of different lengths
  (right-padded sources; decoder-only decoding left-pads) give each sentence's own hypotheses;
- :func:`check_causality`: changing target token ``j`` leaves the logits before ``j`` unchanged;
- :func:`check_gradients`: every trainable parameter gets a finite gradient;
- :func:`check_bf16`: the forward and backward under bf16 autocast stay finite;
- :func:`check_compiles`: ``torch.compile(fullgraph=True)`` traces the training loss with its
  backward, and decoding's ``decode_step``, without a graph break, and they compute eager's values.

A learning-rate schedule (``lr_scheduler``) is no module: :func:`check_schedule` holds it to its own
properties (a finite rate ``>= 0`` at every update, a rising warmup, a pure function of its arguments).

Use :func:`check_option` for all of them on both families, from pytest or the command line::

    python -m transformer.testing plugins=[examples/plugins/diff_attention] model/attention=diff
    python -m transformer.testing model/ffn=moe model.ffn.n_experts=4          # a built-in option
    python -m transformer.testing lr_scheduler=cosine lr_scheduler.min_lr=1e-5   # a schedule

    # in a test file
    from transformer.testing import check_option
    def test_my_attention():
        check_option("model/attention", "diff", plugins=["path/to/my_ideas"])
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Iterable

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from transformer.config import GROUPS, typed_config, validate_config, validate_model_config
from transformer.generation import beam_search, greedy_search
from transformer.models import build_model
from transformer.plugins import ORIGINS, PluginError, import_plugins
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss
from transformer.training.step.schedules import build_scheduler

__all__ = ["ARCHS", "CHECKED", "CHECKS", "MODULES", "check_bf16", "check_causality", "check_compiles", "check_gradients",
           "check_incremental_decoding", "check_model", "check_option", "check_padding", "check_schedule",
           "check_search_batching", "main", "tiny_model"]

ARCHS = ("encoder_decoder", "decoder_only")
V, PAD, BOS, EOS, SEP = 40, 0, 2, 3, 4  # the vocabulary and special ids of the checks' tiny models
_TINY = {"n_encoder_layers": 2, "n_decoder_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "dropout": 0.0,
         "norm_position": "pre"}


def tiny_model(arch: str = "encoder_decoder", options: dict[str, str] | None = None, **fields: Any) -> tuple[nn.Module, DictConfig]:
    """A tiny model of family ``arch`` and its config.

    Args:
        arch: ``encoder_decoder`` or ``decoder_only``.
        options: ``{switch: option}`` (e.g. ``{"model/attention": "diff"}``), each group's node typed
            by the option's dataclass.
        fields: dotted ``model.*`` fields without the ``model.`` prefix (``attention.n_kv_heads=2``).

    Returns:
        ``(model in eval mode, model config)``.

    Raises:
        ConfigError: an invalid combination (named as by training).
    """
    model: dict[str, Any] = {**_TINY, "arch": arch}
    if arch == "decoder_only":
        model["n_encoder_layers"] = 0
    for switch, name in (options or {}).items():
        group = GROUPS[switch]
        node = model
        parts = group.path.split(".")[1:]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = {**node.get(parts[-1], {}), group.key: name}
    cfg = typed_config({"model": model}).model
    for key, value in fields.items():
        OmegaConf.update(cfg, key, value, merge=False)
    validate_model_config(cfg)
    torch.manual_seed(0)
    return build_model(cfg, V).eval(), cfg


def _src_rows(lengths: Iterable[int]) -> list[Tensor]:
    return [torch.randint(5, V, (n,)) for n in lengths]


def _source_batch(model: nn.Module, rows: list[Tensor]) -> Tensor:
    """Right-padded sources in the model's format (encoder-decoder: ids + EOS)."""
    extra = 1 if model.arch == "encoder_decoder" else 0
    src = torch.full((len(rows), max(len(r) for r in rows) + extra), PAD)
    for b, r in enumerate(rows):
        src[b, : len(r)] = r
        if extra:
            src[b, len(r)] = EOS
    return src


def _forward(model: nn.Module, src: Tensor, prev: Tensor) -> Tensor:
    """Teacher-forced logits ``(B, T, V)`` of ``prev`` (decoder inputs, BOS/SEP first) given ``src``
    (without specials; right-padded with PAD)."""
    if model.arch == "encoder_decoder":
        return model(torch.cat([src, torch.full((src.shape[0], 1), EOS)], 1), prev)
    return model(torch.cat([src, prev], 1))[:, src.shape[1]:]


def _close(a: Tensor, b: Tensor, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    try:
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    except AssertionError as err:
        raise AssertionError(f"{what}: {str(err).splitlines()[0]} (max |diff| {(a - b).abs().max().item():.3g})") from None


def check_incremental_decoding(model: nn.Module) -> None:
    """The KV-cached steps equal the full forward at every target step, for sources of lengths 6, 3, 5."""
    rows, tgt = _src_rows([6, 3, 5]), torch.randint(5, V, (3, 6))
    start = model.decoder_start_token_id
    with torch.no_grad():
        expected = torch.stack([
            _forward(model, r[None], torch.cat([torch.tensor([[start]]), tgt[b:b + 1, :-1]], 1))[0]
            for b, r in enumerate(rows)])
        state = model.start_decoding(_source_batch(model, rows))
        prev, steps = torch.full((3, 1), start), []
        for t in range(tgt.shape[1]):
            steps.append(model.decode_step(prev, state))
            prev = tgt[:, t:t + 1]
    _close(torch.stack(steps, 1), expected, "incremental decoding (start_decoding + decode_step) differs from the full forward")


def check_padding(model: nn.Module) -> None:
    """Padding the source and target, or batching with a longer neighbour, leaves a sentence's logits."""
    src, prev = torch.randint(5, V, (1, 5)), torch.cat([torch.tensor([[model.decoder_start_token_id]]),
                                                        torch.randint(5, V, (1, 3))], 1)
    with torch.no_grad():
        ref = _forward(model, src, prev)
        if model.arch == "encoder_decoder":
            src_pad = torch.cat([src, torch.full((1, 1), EOS), torch.full((1, 3), PAD)], 1)
            padded = model(src_pad, torch.cat([prev, torch.full((1, 2), PAD)], 1))[:, :prev.shape[1]]
            other = torch.cat([torch.randint(5, V, (1, 8)), torch.full((1, 1), EOS)], 1)
            batched = model(torch.cat([src_pad[:, :9], other], 0), torch.cat([prev, torch.randint(5, V, (1, 4))], 0))[:1]
        else:
            seq = torch.cat([src, prev], 1)
            padded = model(torch.cat([seq, torch.full((1, 3), PAD)], 1))[:, src.shape[1]:seq.shape[1]]
            batched = ref  # a decoder-only row holds source and target: batching is the search check's
    _close(padded, ref, "padding a sentence changes its logits")
    _close(batched, ref, "batching a sentence with a longer one changes its logits")


def check_search_batching(model: nn.Module) -> None:
    """Greedy and beam search of a batch equal each sentence decoded alone (lengths 7, 2, 4)."""
    rows = _src_rows([7, 2, 4])
    limits = dict(max_len_a=1.0, max_len_b=4, min_len=1, length_penalty_alpha=1.0)
    for name, search in (("greedy", lambda s: greedy_search(model, s, **limits)),
                         ("beam", lambda s: beam_search(model, s, beam_size=3, nbest=1, **limits))):
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
        finite = torch.isfinite(loss).item() and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                                     if p.grad is not None)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    if not finite:
        raise AssertionError("bf16 autocast gives a non-finite loss or gradient")


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
        raise AssertionError(f"{what} does not compile in one graph (torch.compile fullgraph=True): "
                             f"{type(err).__name__}: {reason}") from None
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
        eager_state, state = model.start_decoding(_source_batch(model, rows)), model.start_decoding(_source_batch(model, rows))
        prev = torch.full((3, 1), model.decoder_start_token_id)
        for step in range(2 if model.arch == "encoder_decoder" else 1):
            expected = model.decode_step(prev, eager_state)
            got = _compiled(model.decode_step, f"decode_step (step {step + 1}, KV cache)", "eager", prev, state)
            _close(got, expected, f"the compiled decode_step (step {step + 1}) differs from eager")
            prev = expected.argmax(-1, keepdim=True)


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


def check_option(switch: str | None = None, name: str | None = None, *, plugins: Iterable[str] = (),
                 archs: Iterable[str] = ARCHS, checks: Iterable[str] = CHECKS, options: dict[str, str] | None = None,
                 **fields: Any) -> None:
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


def check_schedule(name: str, *, max_updates: int = 40, base_lr: float = 1e-3, d_model: int = 32,
                   **fields: Any) -> None:
    """The properties of ``lr_scheduler=name`` (``fields``: its ``lr_scheduler.*`` fields, default
    ``warmup_updates=5``), as training builds it (:func:`~transformer.training.build_scheduler`) for a
    run of ``max_updates`` updates at peak ``base_lr``:

    - the config passes validation (the option's ``validate`` / ``validate_config`` included);
    - the rate is finite and ``>= 0`` at every update from 1 to ``max_updates``;
    - with ``warmup_updates >= 2`` it never falls during the warmup and ends it higher than it began;
    - it is a pure function of its arguments: the rates asked in reverse order, asked again, read off
      an optimizer stepped through the run, and read after loading the scheduler's state at every
      update (a resume) are the same numbers.

    Raises:
        AssertionError: a property failed (the message names it and the update).
        ConfigError: an invalid configuration (named as by training).
    """
    cfg = typed_config({"lr_scheduler": {"name": name, "warmup_updates": 5, **fields}, "train": {"max_updates": max_updates}})
    validate_config(cfg)

    def scheduler() -> Any:
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=base_lr)
        return optimizer, build_scheduler(optimizer, cfg.lr_scheduler, base_lr, d_model, max_updates)

    optimizer, sched = scheduler()
    updates = range(1, max_updates + 1)
    rates = [sched.lr_for_update(u) for u in updates]
    for u, lr in zip(updates, rates):
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise AssertionError(f"lr_scheduler={name}: the rate of update {u} is {lr!r}, not a finite number >= 0")
    warmup = int(cfg.lr_scheduler.warmup_updates)
    if warmup >= 2:
        falls = [u for u in range(2, min(warmup, max_updates) + 1) if rates[u - 1] < rates[u - 2]]
        if falls or not rates[min(warmup, max_updates) - 1] > rates[0]:
            raise AssertionError(f"lr_scheduler={name}: the warmup (lr_scheduler.warmup_updates={warmup}) does not rise "
                                 f"(update 1: {rates[0]:.3g}, update {warmup}: {rates[min(warmup, max_updates) - 1]:.3g}"
                                 + (f"; it falls at update {falls[0]}" if falls else "") + ")")
    stepped = []
    for _ in updates:
        stepped.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        sched.step()
    state = sched.state_dict()
    fresh = scheduler()[1]
    again = [fresh.lr_for_update(u) for u in reversed(updates)][::-1]
    resumed = []
    for u in updates:
        other_optimizer, other = scheduler()
        other.load_state_dict({**state, "last_epoch": u - 1})
        resumed.append(float(other_optimizer.param_groups[0]["lr"]))
    for what, values in (("asked in reverse order by a new scheduler", again),
                         ("read off the optimizer during the run", stepped), ("after a resume at each update", resumed)):
        differ = [u for u, a, b in zip(updates, rates, values) if a != b]
        if differ:
            u = differ[0]
            raise AssertionError(f"lr_scheduler={name} is not a pure function of its arguments: the rate of update {u} "
                                 f"is {rates[u - 1]!r}, and {values[u - 1]!r} {what}")


MODULES = ("model/attention", "model/ffn", "model/norm", "model/position")
"""The groups whose options are modules the kit checks on their own (the others, e.g. a RoPE
scaling, are checked with the option they belong to: ``model/position=rope`` and its fields)."""

CHECKED = (*MODULES, "lr_scheduler")
"""The groups whose options the command checks when a plugin is named without an option:
the modules' (:data:`MODULES`, :func:`check_model`) and the schedules (:func:`check_schedule`)."""


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer.testing [plugins=[...]] [<group>=<option> ...] [model.<field>=<value> ...]
    [lr_scheduler.<field>=<value> ...] [train.max_updates=N]``: every check on both families (a
    schedule: :func:`check_schedule`); prints one line per family (per schedule) and exits 1 on the
    first failure, 2 on a bad argument or plugin. Without ``<group>=<option>``, every option of the
    groups of :data:`CHECKED` the named plugins registered is checked in turn (with its default fields)."""
    args = list(sys.argv[1:] if argv is None else argv)
    plugins: list[str] = []
    options: dict[str, str] = {}
    fields: dict[str, Any] = {}
    schedule: dict[str, Any] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            print(f"error: {arg}: expected <group>=<option> or model.<field>=<value>", file=sys.stderr)
            return 2
        if key == "plugins":
            plugins = [p.strip() for p in value.strip("[]").split(",") if p.strip()]
        elif key in GROUPS:
            options[key] = value
        elif key.startswith("model."):
            fields[key[len("model."):]] = OmegaConf.from_dotlist([f"v={value}"]).v
        elif key.startswith("lr_scheduler.") or key == "train.max_updates":
            schedule[key.removeprefix("lr_scheduler.").removeprefix("train.")] = OmegaConf.from_dotlist([f"v={value}"]).v
        else:
            print(f"error: {arg}: expected <group>=<option> ({', '.join(GROUPS)}), model.<field>=<value>, "
                  "lr_scheduler.<field>=<value> or train.max_updates=<n>", file=sys.stderr)
            return 2
    try:
        loaded = {p.name for p in import_plugins(plugins)}
        runs = [options] if options else []
        if not options:
            runs = [{switch: name} for (switch, name), owner in ORIGINS.items() if owner in loaded and switch in CHECKED]
            if not runs:
                raise ValueError("name the option to check, e.g. model/attention=diff (" + (
                    f"the plugins {', '.join(sorted(loaded))} register no option of {', '.join(CHECKED)})"
                    if loaded else f"a group of {', '.join(GROUPS)})"))
        for chosen in runs:
            chosen = dict(chosen)
            if "lr_scheduler" in chosen:
                name = chosen.pop("lr_scheduler")
                check_schedule(name, **schedule)
                print(f"lr_scheduler={name}: finite rates >= 0, a rising warmup, a pure function: passed")
            elif schedule:
                raise ValueError(f"{', '.join(f'lr_scheduler.{k}' for k in schedule)}: name the schedule, e.g. "
                                 "lr_scheduler=cosine")
            if not chosen and fields:
                raise ValueError("model.* fields given without a model option; name one, e.g. model/norm=rmsnorm")
            if not chosen:
                continue
            for arch in ARCHS:
                model, _ = tiny_model(arch, chosen, **fields)
                check_model(model)
                print(f"{arch}: {', '.join(CHECKS)} passed ({', '.join(f'{k}={v}' for k, v in chosen.items())})")
    except (PluginError, ValueError) as err:
        print("error: " + " ".join(str(err).split()), file=sys.stderr)  # one line, whatever raised it
        return 2
    except AssertionError as err:
        print(f"failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
