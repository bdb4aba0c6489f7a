"""The cases of the fake-CUDA dry run, derived from the option tables so that a new option is covered
(or the coverage test says it cannot be placed).

* one case per model preset (``configs/model/*.yaml``) at tiny sizes (:data:`TINY`); presets that
  are then the same model (``transformer_small`` and ``transformer_2017_base`` differ in sizes only)
  run once;
* switch combinations, built greedily until every option of every group of :func:`groups` has run
  at least once (the presets count): the model switches (``ATTENTION_KINDS``, ``FFNS``, ``NORMS``,
  ``POSITIONS``, ``ROPE_SCALINGS``, ``RESIDUALS``, ``ROUTER_SCORES``, both families, QK-norm,
  sliding windows, tied and untied embeddings, gated and plain experts, shared experts, MLA's query
  latent, biases, attention dropout) and the training switches (learning-rate schedules,
  optimizers, gradient accumulation, moving average, clipping, label smoothing). An option that only
  means something under another (a RoPE scaling under ``model/position=rope``, a router under
  ``model/ffn=moe``) counts only there, and every combination is validated
  (:func:`~transformer.config.validate_model_config`) before it is kept.

Every case runs in fp32, bf16 (autocast) and fp16 (autocast and the GradScaler). The configs are
resolved here without Hydra (group and preset YAML files merged into the typed dataclasses, as
Hydra's defaults lists do); the runner composes each case with Hydra and checks that both agree.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tests.conftest import REPO_ROOT
from transformer.config import Config, ConfigError, ModelConfig, option_config, validate_model_config
from transformer.modules.attention import ATTENTION_KINDS
from transformer.modules.ffn import FFNS
from transformer.modules.moe_router import ROUTER_SCORES
from transformer.modules.norms import NORMS
from transformer.modules.positions import POSITIONS
from transformer.modules.residual import RESIDUALS
from transformer.modules.rope_scaling import ROPE_SCALINGS
from transformer.plugins import ORIGINS

CONFIGS = REPO_ROOT / "configs"
PRECISIONS = ("fp32", "bf16", "fp16")
TINY = (
    "model.d_model=32",
    "model.n_heads=4",
    "model.d_ff=64",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "model.max_positions=64",
    "model.ffn.n_experts=2",
    "model.dropout=0.1",
)
"""Sizes of every case: 1+1 layers (a decoder-only model stacks both: 2), width 32, 4 heads, 2 experts,
dropout 0.1 (so that presets differing only in size and dropout are one case)."""
TRAIN = (
    "train.device=cuda",
    "train.max_tokens=64",
    "train.max_updates=100",
    "train.compile=false",
    "train.progress=false",
    "lr_scheduler.warmup_updates=4",
    "data.max_source_positions=30",
    "data.max_target_positions=30",
    "train.valid_bleu_subset=2",
    "generation.beam_size=2",
    "generation.max_len_a=0.0",
    "generation.max_len_b=1",
)
"""Training settings of every case (the synthetic corpus has 2-6 ids per side; validation BLEU
translates 2 sentences with beam 2, at most one token before EOS)."""
_ONE_LAYER = "model.n_encoder_layers=0"
"""A decoder-only case stacks one layer (two when local and global layers alternate)."""


@dataclass(frozen=True)
class Group:
    """A switch of the dry run's coverage.

    Attributes:
        name: the table or field it comes from (``ATTENTION_KINDS``, ``model.qk_norm``, ...).
        options: option name -> its Hydra overrides.
        read: the option a whole config (a DictConfig of :class:`~transformer.config.Config`) has.
        applies: whether the group means anything given the other choices (a RoPE scaling only under
            RoPE); None: always.
        model: whether the overrides are model fields (validated with ``validate_model_config``).
    """

    name: str
    options: dict[str, tuple[str, ...]]
    read: Callable[[Any], str]
    applies: Callable[[dict[str, str]], bool] | None = None
    model: bool = True


def _stems(folder: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / folder).glob("*.yaml"))


def _on_off(key: str, on: str, off: str = "0.0") -> dict[str, tuple[str, ...]]:
    return {"off": (f"{key}={off}",), "on": (f"{key}={on}",)}


def _built_in(table: Iterable[str]) -> list[str]:
    """The table's built-in options: every test process holds the example plugins' options too
    (``tests/conftest.py``), and the dry run's child process does not import them."""
    plugin_options = {option for _, option in ORIGINS}
    return [k for k in table if k not in plugin_options]


def groups() -> list[Group]:
    """Every group the dry run covers, parents before the groups that depend on them (built-in options
    only, :func:`_built_in`)."""
    ffns = {k: FFNS[k] for k in _built_in(FFNS)}
    plain_expert = next(n for n, c in ffns.items() if not c.routed and not c.gated)
    gated_expert = next(n for n, c in ffns.items() if not c.routed and c.gated)
    rope = ("model.position.rope_scaling.factor=2.0", "model.position.rope_scaling.original_max_position_embeddings=16")
    moe = lambda c: FFNS[c["FFNS"]].routed  # noqa: E731
    return [
        Group(
            "model.arch", {a: (f"model.arch={a}",) for a in ("encoder_decoder", "decoder_only")}, lambda c: c.model.arch
        ),
        Group(
            "ATTENTION_KINDS",
            {k: (f"model/attention={k}",) for k in _built_in(ATTENTION_KINDS)},
            lambda c: c.model.attention.name,
        ),
        Group("FFNS", {k: (f"model/ffn={k}",) for k in ffns}, lambda c: c.model.ffn.name),
        Group("NORMS", {k: (f"model/norm={k}",) for k in _built_in(NORMS)}, lambda c: c.model.norm.name),
        Group(
            "POSITIONS", {k: (f"model/position={k}",) for k in _built_in(POSITIONS)}, lambda c: c.model.position.name
        ),
        Group("RESIDUALS", {k: (f"model.norm_position={k}",) for k in RESIDUALS}, lambda c: c.model.norm_position),
        Group(
            "model.qk_norm",
            {k: (f"model.qk_norm={k}",) for k in ("none", *_built_in(NORMS))},
            lambda c: c.model.qk_norm,
        ),
        Group(
            "model.tie_embeddings",
            {k: (f"model.tie_embeddings={k}",) for k in ("none", "decoder", "all")},
            lambda c: c.model.tie_embeddings,
        ),
        Group("model.bias", {k: (f"model.bias={k}",) for k in ("true", "false")}, lambda c: str(c.model.bias).lower()),
        Group(
            "model.attention_dropout",
            _on_off("model.attention_dropout", "0.1"),
            lambda c: "on" if c.model.attention_dropout else "off",
        ),
        Group(
            "model.attention_window",
            {"global": ("model.attention_window=null",), "local": ("model.attention_window=4",)},
            lambda c: "global" if c.model.attention_window is None else "local",
        ),
        Group(
            "model.attention_window_pattern",
            {"all local": ("model.attention_window_pattern=0",), "alternating": ("model.attention_window_pattern=2",)},
            lambda c: "alternating" if c.model.attention_window_pattern else "all local",
            lambda c: c["model.attention_window"] == "local",
        ),
        Group(
            "ROPE_SCALINGS",
            {
                k: (f"model.position.rope_scaling.rope_type={k}", *(rope if k != "default" else ()))
                for k in _built_in(ROPE_SCALINGS)
            },
            lambda c: c.model.position.rope_scaling.rope_type,
            lambda c: c["POSITIONS"] == "rope",
        ),
        Group(
            "ROUTER_SCORES",
            {k: (f"model.ffn.router={k}",) for k in _built_in(ROUTER_SCORES)},
            lambda c: c.model.ffn.router,
            moe,
        ),
        Group(
            "model.ffn.expert",
            {"plain": (f"model.ffn.expert={plain_expert}",), "gated": (f"model.ffn.expert={gated_expert}",)},
            lambda c: "gated" if FFNS[c.model.ffn.expert].gated else "plain",
            moe,
        ),
        Group(
            "model.ffn.n_shared_experts",
            {"none": ("model.ffn.n_shared_experts=0",), "some": ("model.ffn.n_shared_experts=1",)},
            lambda c: "some" if c.model.ffn.n_shared_experts else "none",
            moe,
        ),
        Group(
            "model.attention.q_lora_rank",
            {"full": (), "low-rank": ("model.attention.q_lora_rank=16",)},
            lambda c: "full" if c.model.attention.get("q_lora_rank") is None else "low-rank",
            lambda c: ATTENTION_KINDS[c["ATTENTION_KINDS"]].latent,
        ),
        Group(
            "lr_scheduler",
            {k: (f"lr_scheduler={k}",) for k in _stems("lr_scheduler")},
            lambda c: c.lr_scheduler.name,
            model=False,
        ),
        Group("optim", {k: (f"optim={k}",) for k in _stems("optim")}, lambda c: c.optim.name, model=False),
        Group(
            "train.update_freq",
            {"1": ("train.update_freq=1",), "2": ("train.update_freq=2",)},
            lambda c: str(c.train.update_freq),
            model=False,
        ),
        Group(
            "train.ema_decay",
            _on_off("train.ema_decay", "0.99"),
            lambda c: "on" if c.train.ema_decay else "off",
            model=False,
        ),
        Group(
            "train.clip_norm",
            _on_off("train.clip_norm", "1.0"),
            lambda c: "on" if c.train.clip_norm else "off",
            model=False,
        ),
        Group(
            "criterion.label_smoothing",
            _on_off("criterion.label_smoothing", "0.1"),
            lambda c: "on" if c.criterion.label_smoothing else "off",
            model=False,
        ),
    ]


# ----------------------------------------------------------------------------- configs without Hydra


@functools.cache
def yaml_value(text: str) -> Any:
    """``"2.0"`` -> 2.0, ``"true"`` -> True, ``"null"`` -> None, ``"4"`` -> 4 (YAML's reading)."""
    return OmegaConf.to_container(OmegaConf.create(f"value: {text}"))["value"]


@functools.cache
def _group_node(switch: str, option: str) -> DictConfig:
    node = OmegaConf.structured(option_config(switch, option))
    path = CONFIGS / switch / f"{option}.yaml"
    if path.is_file():
        data = OmegaConf.load(path)
        data.pop("defaults", None)
        node = OmegaConf.merge(node, data)
    return node


def group_node(switch: str, option: str) -> DictConfig:
    """The node of ``<switch>=<option>``: the option's dataclass with its YAML file merged in."""
    return copy.deepcopy(_group_node(switch, option))


@functools.cache
def _resolve_preset(name: str) -> DictConfig:
    data = OmegaConf.load(CONFIGS / "model" / f"{name}.yaml")
    defaults = list(data.pop("defaults", []))
    if "_self_" not in defaults:
        defaults.append("_self_")
    cfg = _base_model()
    for entry in defaults:
        if entry == "_self_":
            cfg = OmegaConf.merge(cfg, data)
        elif isinstance(entry, str):  # a parent preset
            cfg = resolve_preset(entry)
        else:  # {group: option} or {"override group": option}
            ((key, option),) = entry.items()
            group = key.split()[-1]
            cfg[group] = group_node(f"model/{group}", option)
    return cfg


def resolve_preset(name: str) -> DictConfig:
    """``configs/model/<name>.yaml`` as Hydra composes it: its defaults list (a parent preset, group
    choices, ``override`` choices, ``_self_``, last when not listed) in order."""
    return copy.deepcopy(_resolve_preset(name))


@functools.cache
def _base(kind: str) -> DictConfig:
    return OmegaConf.structured(Config() if kind == "config" else ModelConfig())


def _base_model() -> DictConfig:
    return copy.deepcopy(_base("model"))


def _order(item: str) -> int:
    """Hydra applies group choices before field overrides: ``model=``, then ``model/<group>=``, then the rest."""
    key = item.split("=", 1)[0]
    return 0 if key == "model" else 1 if key.startswith("model/") or key in ("lr_scheduler", "optim") else 2


def apply(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """Apply Hydra-style overrides to a whole config (``model=<preset>``, ``model/<group>=<option>``,
    ``lr_scheduler=``/``optim=`` options, dotted fields) in Hydra's order; returns ``cfg``."""
    for item in sorted(overrides, key=_order):
        key, value = item.split("=", 1)
        if key == "model":
            cfg.model = resolve_preset(value)
        elif key.startswith("model/"):
            cfg.model[key.split("/", 1)[1]] = group_node(key, value)
        elif key in ("lr_scheduler", "optim"):
            cfg[key] = OmegaConf.merge(cfg[key], OmegaConf.load(CONFIGS / key / f"{value}.yaml"))
        elif key.split(".")[0] in ("model", "train", "criterion", "lr_scheduler", "optim", "data", "generation"):
            OmegaConf.update(cfg, key, yaml_value(value), merge=False)
    return cfg


def full_config(overrides: list[str]) -> DictConfig:
    """The :class:`~transformer.config.Config` the overrides make (see :func:`apply`) on the dataclass
    defaults (computed once per list of overrides: do not modify it)."""
    return _full_config(tuple(overrides))


@functools.cache
def _full_config(overrides: tuple[str, ...]) -> DictConfig:
    return apply(copy.deepcopy(_base("config")), list(overrides))


def valid(cfg: DictConfig) -> bool:
    """Whether ``cfg`` (a whole config) has a valid model config."""
    try:
        validate_model_config(cfg.model)
    except (ConfigError, ValueError):
        return False
    return True


# ----------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One configuration of the dry run.

    Attributes:
        name: ``preset:<name>`` or ``combo:<n>``.
        overrides: Hydra overrides after :data:`TINY` and :data:`TRAIN`.
        covers: group -> option, the options this case accounts for.
        same: other presets that are the same model at tiny sizes (run once, under this case).
        precisions: the precisions it trains in (one update each).
        fit: the precisions that run ``Trainer.fit`` (one update, validation, ``checkpoint_last``)
            instead of ``Trainer.train_step``.
        resume: the precisions (among ``fit``'s) whose checkpoint is read on the host and resumed on
            the fake GPU.
        decoding: the precisions that also run greedy and beam search.
    """

    name: str
    overrides: list[str]
    covers: dict[str, str] = field(default_factory=dict)
    same: list[str] = field(default_factory=list)
    precisions: tuple[str, ...] = PRECISIONS
    fit: tuple[str, ...] = ()
    resume: tuple[str, ...] = ()
    decoding: tuple[str, ...] = ()

    def all_overrides(self) -> list[str]:
        """:data:`TINY`, :data:`TRAIN`, then the case's own."""
        return [*TINY, *TRAIN, *self.overrides]

    def model(self) -> dict[str, Any]:
        """The model config (plain containers)."""
        return OmegaConf.to_container(full_config(self.all_overrides()).model, resolve=True)

    def as_dict(self) -> dict[str, Any]:
        """JSON for the runner: the whole config (:func:`full_config`), and for a preset the Hydra
        overrides that the runner composes and compares with it."""
        cfg = OmegaConf.to_container(full_config(self.all_overrides()), resolve=True)
        return {
            "name": self.name,
            "config": cfg,
            "compose": self.all_overrides() if self.name.startswith("preset:") else None,
            "precisions": list(self.precisions),
            "fit": list(self.fit),
            "resume": list(self.resume),
            "decoding": list(self.decoding),
        }


def covers(cfg: DictConfig) -> dict[str, str]:
    """group -> the option ``cfg`` (a whole config) has, for the groups that apply to it."""
    out: dict[str, str] = {}
    for g in groups():
        if g.applies is not None and not _applies(g, out):
            continue
        option = g.read(cfg)
        if option in g.options:
            out[g.name] = option
    return out


def preset_cases() -> list[Case]:
    """One case per distinct ``configs/model/*.yaml`` preset at tiny sizes (the others listed in ``same``)."""
    out: list[Case] = []
    seen: dict[str, Case] = {}
    for name in _stems("model"):
        case = Case(f"preset:{name}", [f"model={name}"])
        if full_config(case.all_overrides()).model.arch == "decoder_only":
            case.overrides.append(_ONE_LAYER)
        key = json.dumps(case.model(), sort_keys=True)
        if key in seen:
            seen[key].same.append(name)
            continue
        case.covers = covers(full_config(case.all_overrides()))
        seen[key] = case
        out.append(case)
    return out


def combo_cases(covered: list[Case] = (), max_cases: int = 40) -> list[Case]:
    """Switch combinations until every option of every group of :func:`groups` is covered, after
    what the ``covered`` cases (the presets) cover.

    Each combination takes, group by group, the first option not covered yet that keeps the model
    valid (preferring, for a group others depend on, the option that lets an uncovered dependent
    option in), else a valid one: for a model group in table order shifted by the combination's
    number (so that combinations vary), for a training group the first (the cheapest: no
    accumulation, no moving average).
    """
    all_groups = groups()
    uncovered = {g.name: list(g.options) for g in all_groups}
    for case in covered:
        for name, option in case.covers.items():
            if option in uncovered[name]:
                uncovered[name].remove(option)
    cases: list[Case] = []
    while any(uncovered.values()) and len(cases) < max_cases:
        chosen: dict[str, str] = {}
        overrides: list[str] = []
        cfg = OmegaConf.create(
            {"model": copy.deepcopy(full_config(list(TINY)).model)}
        )  # the model is all that is checked
        for g in all_groups:
            if g.applies is not None and not _applies(g, chosen):
                continue
            for option in _ordered(g, uncovered, all_groups, chosen, rotate=len(cases) if g.model else 0):
                trial = apply(copy.deepcopy(cfg), list(g.options[option])) if g.model else cfg
                if not g.model or valid(trial):
                    chosen[g.name], overrides, cfg = option, [*overrides, *g.options[option]], trial
                    break
            else:
                raise AssertionError(f"no option of {g.name} makes a valid model with {chosen}")
        for name, option in chosen.items():
            if option in uncovered[name]:
                uncovered[name].remove(option)
        if chosen["model.arch"] == "decoder_only" and chosen.get("model.attention_window_pattern") != "alternating":
            overrides.append(_ONE_LAYER)
        cases.append(Case(f"combo:{len(cases)}", overrides, dict(chosen)))
    return cases


def _applies(g: Group, chosen: dict[str, str]) -> bool:
    try:
        return bool(g.applies(chosen))
    except KeyError:  # depends on a group not chosen (yet)
        return False


def _ordered(
    g: Group, uncovered: dict[str, list[str]], all_groups: list[Group], chosen: dict[str, str], rotate: int = 0
) -> list[str]:
    """``g``'s options, best first: uncovered ones that open an uncovered dependent option, other
    uncovered ones, then the rest (in table order shifted by ``rotate``, so that combinations vary)."""
    dependents = [d for d in all_groups if d.applies is not None and uncovered[d.name]]

    def opens(option: str) -> bool:
        return any(_applies(d, {**chosen, g.name: option}) for d in dependents)

    todo, names = uncovered[g.name], list(g.options)
    return sorted(names, key=lambda o: (not opens(o), o not in todo, (names.index(o) - rotate) % len(names)))


DECODING_GROUPS = ("model.arch", "ATTENTION_KINDS", "FFNS", "POSITIONS", "model.attention_window", "ROPE_SCALINGS")
"""The groups whose options change the decoding path (caches, positions of new tokens, routing)."""


def cases() -> list[Case]:
    """Every case: the distinct presets (each in fp32, bf16 and fp16), then the switch combinations
    for what they leave uncovered (one precision each, in turn). In each family a dense preset runs
    ``Trainer.fit`` (with a moving average: validation with the average swapped in, and
    ``checkpoint_last``, after its update) and resumes from that checkpoint (fp16 for the
    encoder-decoder: the GradScaler's state; bf16 for the decoder-only model). Greedy and beam search run in the fewest
    cases that cover every option of :data:`DECODING_GROUPS` (the dense feed-forward blocks count as
    one option, the RoPE scalings other than ``dynamic`` too: they differ in their tables only)."""
    presets = preset_cases()
    combos = combo_cases(presets)
    for i, case in enumerate(combos):
        case.precisions = (PRECISIONS[i % len(PRECISIONS)],)
    for arch, precision in (("encoder_decoder", "fp16"), ("decoder_only", "bf16")):
        plain = next(
            c
            for c in presets
            if c.covers.get("model.arch") == arch
            and not FFNS[c.covers["FFNS"]].routed
            and not ATTENTION_KINDS[c.covers["ATTENTION_KINDS"]].latent
        )
        plain.fit = plain.resume = (precision,)
    out = [*presets, *combos]
    for case in decoding_cases(out):
        case.decoding = ("fp32",) if "fp32" in case.precisions else case.precisions[:1]
    return out


_DECODING_KINDS: dict[str, Callable[[str], str]] = {
    "FFNS": lambda o: "moe" if FFNS[o].routed else "dense",  # a dense block decodes as any other
    "ROPE_SCALINGS": lambda o: "dynamic" if o == "dynamic" else "static",  # static scalings differ in tables only
}


def decoding_options(case: Case) -> set[tuple[str, str]]:
    """``(group, option)`` of :data:`DECODING_GROUPS` that ``case`` decodes with (options grouped as
    :data:`_DECODING_KINDS` says)."""
    return {(g, _DECODING_KINDS.get(g, str)(case.covers[g])) for g in DECODING_GROUPS if g in case.covers}


def decoding_cases(all_cases: list[Case]) -> list[Case]:
    """The fewest cases (greedily) whose decoding covers every option of :data:`DECODING_GROUPS` they cover together."""
    todo = set().union(*(decoding_options(c) for c in all_cases))
    chosen: list[Case] = []
    while todo:
        best = max(all_cases, key=lambda c: len(decoding_options(c) & todo))
        chosen.append(best)
        todo -= decoding_options(best)
    return chosen


def coverage(all_cases: list[Case]) -> dict[str, set[str]]:
    """group -> the options the cases cover."""
    out: dict[str, set[str]] = {g.name: set() for g in groups()}
    for case in all_cases:
        for name, option in case.covers.items():
            out[name].add(option)
    return out


__all__ = [
    "CONFIGS",
    "DECODING_GROUPS",
    "Case",
    "Group",
    "PRECISIONS",
    "TINY",
    "TRAIN",
    "cases",
    "combo_cases",
    "coverage",
    "covers",
    "apply",
    "decoding_cases",
    "decoding_options",
    "full_config",
    "groups",
    "preset_cases",
    "resolve_preset",
    "valid",
]


if __name__ == "__main__":  # print the cases
    every = cases()
    for c in every:
        print(c.name, c.same or "", c.precisions, "fit", c.fit, "resume", c.resume, "decoding", c.decoding)
    print({k: sorted(v) for k, v in coverage(every).items()})
