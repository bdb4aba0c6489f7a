"""The public registration API: a plugin adds options to the same tables the built-in options live in.

One function per group, each usable as a decorator (``@register_attention("diff", ...)`` over the
class) or called with the part. A plugin folder's ``__init__.py`` calls them at import
(:mod:`transformer.plugins`); an option registered here is then chosen on the command line like a
built-in one (``model/attention=diff``), validated, sized, built, trained, resumed, swept and
compared by the same code. An option with fields of its own passes ``config=``, a dataclass
subclassing the group's (e.g. :class:`~transformer.config.AttentionConfig`) whose ``name`` defaults
to the option (a RoPE scaling's ``rope_type``): its fields live under the group's node
(``model.attention.lambda_init``, ``lr_scheduler.decay_fraction``), typed and checked like a
built-in option's, and ``<group>=<name>`` selects it without a YAML file
(``+model/position/rope_scaling=<name>`` for a RoPE scaling). The dataclass may check them, before
anything is built or written, with two optional methods whose ``ValueError`` refuses the command in
one line (``<group>=<name>: <message>``, exit status 2;
:func:`transformer.config.validate_option_fields`): ``validate(self)``, called with the option's
node, and ``validate_config(self, cfg)``, called with the node and the whole config
(``cfg.train.max_updates``, ``cfg.model.d_model``, ...) to refuse a combination with other fields.
Those fields follow one rule (:mod:`transformer.config.rules`), whatever their metadata says: they define the
configuration (runs that differ in them are different rows of ``compare.py``, and a finished twin of
``train.finished_runs`` must have their values) and are fixed on resume (a command line naming
another value is refused), like a built-in option's own fields (``recipe``).

Contracts (keyword arguments only; tensor shapes ``(batch, seq_len, d_model)`` unless said). What
each group's option receives of its own fields (``config``: the group's node, typed by the option's
dataclass; an option without one gets the group's base fields) is said per group; the builder passes
``config`` to a ``from_sizes`` that names it:

- **attention** (:func:`register_attention`): a class with a classmethod ``from_sizes(*, d_model,
  n_heads, n_kv_heads, head_dim, bias, dropout, qk_norm, config)`` (``qk_norm``: ``width -> norm
  module`` or None; ``config``: the ``model.attention`` node) whose instances answer
  ``forward(x, memory=None, attn_mask=None, is_causal=False, rotary=None, cache=None)`` like
  :class:`~transformer.modules.attention.Attention`: ``attn_mask`` a bool mask broadcastable to
  ``(batch, n_heads, q_len, k_len)`` (True = attend) or None with ``is_causal``; ``rotary`` the
  ``(cos, sin)`` tables of the new positions (apply with
  :func:`~transformer.kernels.rotary.apply_rotary`); ``cache`` a
  :class:`~transformer.modules.attention_core.KVCache` to which self-attention appends its keys and
  values with ``cache.extend(k, v)`` (returning every cached key/value, window-trimmed) so that
  incremental decoding equals the full forward. It is used for self-attention; an encoder-decoder's
  cross-attention stays multi-head attention.
- **ffn** (:func:`register_ffn`): a block class with ``from_sizes(*, d_model, hidden, activation,
  bias, dropout[, config])`` (``config``: the ``model.ffn`` node; as a mixture of experts' shared
  expert, its option's default fields), a static ``hidden_size(d_ff, glu_match_params, multiple_of)`` and a
  class attribute ``n_matrices`` (``d_model x hidden`` matrices: parameter and FLOP counts), e.g.
  :class:`~transformer.modules.ffn.GatedFeedForward` with another ``activation`` (a gated block can
  also be a mixture-of-experts expert).
- **norm** (:func:`register_norm`): a module class over the last dimension ``width``, built by its
  classmethod ``from_sizes(*, width, eps[, config])`` when it has one (``config``: the ``model.norm``
  node; for the ``model.qk_norm`` norms over ``head_dim``, the ``model.norm`` node when
  ``model.qk_norm`` names the same option, else the option's default fields with
  ``model.norm.eps``: ``model.qk_norm`` is a name without a node of its own), else called as
  ``cls(width, eps=eps)``.
- **position** (:func:`register_position`): a :class:`~transformer.modules.positions.PositionEncoding`
  subclass answering ``embed`` / ``rotary`` / ``score_bias``, built by its ``from_sizes(*, d_model,
  n_heads, max_positions, rope_theta, rotary_dim, rope_scaling[, config])`` (``config``: the
  ``model.position`` node).
- **RoPE scaling** (:func:`register_rope_scaling`): gives ``(inv_freq (head_dim // 2,), attention_factor)``
  for the rotated width ``head_dim`` and base ``theta``: a class with a classmethod ``from_sizes(*, head_dim,
  theta, scaling[, config])`` (``scaling``: the
  :class:`~transformer.modules.rope_scaling.RopeScaling` of the built-in fields; ``config``: the
  ``model.position.rope_scaling`` node), or a plain function ``fn(head_dim, theta, scaling)``. Chosen
  with ``model.position.rope_scaling.rope_type=<name>``, or, to set fields of its own on the command
  line, ``+model/position/rope_scaling=<name>`` (Hydra's append: the group has no entry in the
  defaults list).
- **MoE router** (:func:`register_router`): ``scores((N, E) fp32 logits) -> (N, E) scores``
  (``model.ffn.router`` is a name inside ``model.ffn``, not a group with a node: a router has no
  fields of its own; one that needs a setting takes it as a constant of its plugin).
- **learning-rate schedule** (:func:`register_lr_scheduler`): ``schedule(update, cfg, base_lr,
  d_model, max_updates) -> lr`` (updates numbered from 1; ``cfg`` holds every ``lr_scheduler.*``
  field, the option's own included, as plain values). It must be a pure function of its arguments
  and give a finite rate ``>= 0`` at every update from 1 to ``max_updates``, rising during
  ``lr_scheduler.warmup_updates`` (:func:`transformer.testing.check_schedule`).

An exception a plugin's code raises while a run is built or trains (outside ``validate``) ends
``scripts/train.py`` in one line naming the plugin, its file and line (exit status 2); a run that
trained nothing leaves no folder behind. ``scripts/translate.py``, ``evaluate.py`` and ``export.py``
end the same way when a plugin's code raises as they build or run the model
(:func:`transformer.cli.plugin_failure`).

Every function raises :class:`~transformer.config.ConfigError` for a name a built-in option (or
another plugin) already holds, naming both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from transformer.config import ConfigError, register_option_config
from transformer.config.options import LR_SCHEDULERS, store_plugin_option
from transformer.modules.attention import ATTENTION_KINDS, AttentionKind
from transformer.modules.ffn import FFNS, FFNChoice
from transformer.modules.moe_router import ROUTER_SCORES, RouterScoring
from transformer.modules.norms import NORMS
from transformer.modules.positions import POSITIONS, PositionEncoding
from transformer.modules.rope_scaling import ROPE_SCALINGS
from transformer.plugins import ORIGINS, current_plugin
from transformer.training.step.schedules import SCHEDULES

__all__ = [
    "register_attention",
    "register_ffn",
    "register_lr_scheduler",
    "register_norm",
    "register_position",
    "register_rope_scaling",
    "register_router",
]


def _claim(switch: str, name: str, taken: Any) -> None:
    """Refuse a name the group already has (built in, or another plugin's), then note whose it is."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"{switch}: a plugin option's name must be an identifier, got {name!r}")
    if name in taken:
        owner = ORIGINS.get((switch, name))
        what = f"the plugin {owner}'s" if owner else "a built-in"
        raise ConfigError(
            f"{switch}={name} is {what} option already; the plugin {current_plugin() or '(none)'} "
            "must register its option under another name"
        )
    ORIGINS[(switch, name)] = current_plugin() or "(registered outside a plugin)"


def _options(switch: str, name: str, config: type | None) -> None:
    """Make ``<switch>=<name>`` selectable without a YAML file, typed by ``config`` when given."""
    if config is not None:
        register_option_config(switch, name, config, store_option=True)
    else:
        store_plugin_option(switch, name)


def _decorate(register: Callable[[Any], None], part: Any) -> Any:
    if part is None:

        def decorator(obj: Any) -> Any:
            register(obj)
            return obj

        return decorator
    register(part)
    return part


def _default_kv_heads(n_heads: int, n_kv_heads: int | None) -> int:
    """Key/value heads of a plugin attention that does not give its own rule: ``n_kv_heads``
    (a divisor of ``n_heads``) or, when null, ``n_heads``."""
    kv = n_heads if n_kv_heads is None else int(n_kv_heads)
    if kv <= 0 or n_heads % kv:
        raise ValueError(f"needs n_kv_heads dividing n_heads ({n_heads}) or null, got n_kv_heads={n_kv_heads}")
    return kv


def register_attention(
    name: str,
    cls: type[nn.Module] | None = None,
    *,
    config: type | None = None,
    kv_heads: Callable[[int, int | None], int] | None = None,
    cache_values: Callable[[int, int, int, Any], int] | None = None,
    cost: Callable[[int, int, int, int, Any], tuple[int, int, int]] | None = None,
) -> Any:
    """Register a self-attention class as ``model/attention=<name>`` (contract in the module docstring).

    Args:
        name: the option.
        cls: the class (omit to use this as a decorator).
        config: its own fields (a dataclass subclassing :class:`~transformer.config.AttentionConfig`).
        kv_heads: ``(n_heads, n_kv_heads or None) -> key/value heads``, raising ``ValueError`` when they
            do not fit (default: ``n_kv_heads`` dividing ``n_heads``, null = ``n_heads``).
        cache_values: ``(n_heads, n_kv_heads, head_dim, config) -> values one layer caches per token``
            (the KV-cache column of compare.py; None: unknown).
        cost: ``(d_model, n_heads, n_kv_heads, head_dim, config) -> (projection weights of one layer,
            query/key width, value width over all heads)`` (FLOPs per token; None: unknown).

    Raises:
        ConfigError: a taken name, a class without ``from_sizes``, or ``config`` not fitting the group.
    """

    def register(obj: Any) -> None:
        if not callable(getattr(obj, "from_sizes", None)):
            raise ConfigError(
                f"model/attention={name}: {obj!r} needs a classmethod from_sizes(*, d_model, n_heads, "
                "n_kv_heads, head_dim, bias, dropout, qk_norm, config)"
            )
        _claim("model/attention", name, ATTENTION_KINDS)
        _options("model/attention", name, config)
        ATTENTION_KINDS[name] = AttentionKind(kv_heads or _default_kv_heads, obj, cache_values, cost)

    return _decorate(register, cls)


def register_ffn(
    name: str, block: type[nn.Module] | None = None, *, activation: Callable | None = None, config: type | None = None
) -> Any:
    """Register a feed-forward block as ``model/ffn=<name>``: a block class (contract in the module
    docstring) with the activation it applies (e.g. ``GatedFeedForward`` with ``F.relu``: ReGLU).

    Raises:
        ConfigError: a taken name, a block missing ``from_sizes`` / ``hidden_size`` / ``n_matrices``,
            or ``config`` not fitting the group.
    """

    def register(obj: Any) -> None:
        missing = [a for a in ("from_sizes", "hidden_size", "n_matrices") if not hasattr(obj, a)]
        if missing:
            raise ConfigError(f"model/ffn={name}: {obj!r} lacks {', '.join(missing)} (see transformer.registry)")
        _claim("model/ffn", name, FFNS)
        _options("model/ffn", name, config)
        FFNS[name] = FFNChoice(obj, activation)

    return _decorate(register, block)


def register_norm(name: str, cls: type[nn.Module] | None = None, *, config: type | None = None) -> Any:
    """Register a norm class as ``model/norm=<name>`` (and ``model.qk_norm=<name>``): built by its
    ``from_sizes(*, width, eps[, config])`` when it has one, else as ``cls(width, eps=eps)``.

    Args:
        name: the option.
        cls: the class (omit to use this as a decorator).
        config: its own fields (a dataclass subclassing :class:`~transformer.config.NormConfig`),
            given to ``from_sizes`` as ``config``.

    Raises:
        ConfigError: a taken name, ``config`` without a class that has ``from_sizes(..., config)``
            to receive it, or ``config`` not fitting the group.
    """

    def register(obj: Any) -> None:
        if config is not None and not callable(getattr(obj, "from_sizes", None)):
            raise ConfigError(
                f"model/norm={name}: {obj!r} has fields of its own (config=) and needs a classmethod "
                "from_sizes(*, width, eps, config) to receive them"
            )
        _claim("model/norm", name, NORMS)
        _options("model/norm", name, config)
        NORMS[name] = obj

    return _decorate(register, cls)


def register_position(name: str, cls: type[PositionEncoding] | None = None, *, config: type | None = None) -> Any:
    """Register a :class:`~transformer.modules.positions.PositionEncoding` subclass as ``model/position=<name>``."""

    def register(obj: Any) -> None:
        if not (isinstance(obj, type) and issubclass(obj, PositionEncoding)):
            raise ConfigError(f"model/position={name}: {obj!r} is not a PositionEncoding subclass")
        _claim("model/position", name, POSITIONS)
        _options("model/position", name, config)
        POSITIONS[name] = obj

    return _decorate(register, cls)


def register_rope_scaling(name: str, fn: Callable | None = None, *, config: type | None = None) -> Any:
    """Register a RoPE scaling as ``model.position.rope_scaling.rope_type=<name>``: a class whose
    classmethod ``from_sizes(*, head_dim, theta, scaling[, config])`` gives ``(inv_freq,
    attention_factor)``, or a function ``fn(head_dim, theta, scaling)`` giving the same
    (:func:`~transformer.modules.rope_scaling.rope_inv_freq`).

    Args:
        name: the option.
        fn: the class or function (omit to use this as a decorator).
        config: its own fields (a dataclass subclassing :class:`~transformer.config.RopeScalingConfig`
            whose ``rope_type`` defaults to ``name``), given to ``from_sizes`` as ``config``.

    Raises:
        ConfigError: a taken name, ``config`` without a class that has ``from_sizes(..., config)``
            to receive it, or ``config`` not fitting the group.
    """

    def register(obj: Any) -> None:
        if config is not None and not callable(getattr(obj, "from_sizes", None)):
            raise ConfigError(
                f"model/position/rope_scaling={name}: {obj!r} has fields of its own (config=) and needs "
                "a classmethod from_sizes(*, head_dim, theta, scaling, config) to receive them"
            )
        if not callable(obj):
            raise ConfigError(f"model/position/rope_scaling={name}: {obj!r} is neither a function nor a class")
        _claim("model/position/rope_scaling", name, ROPE_SCALINGS)
        _options("model/position/rope_scaling", name, config)
        ROPE_SCALINGS[name] = obj

    return _decorate(register, fn)


def register_router(name: str, scores: Callable | None = None, *, sums_to_one: bool = False) -> Any:
    """Register ``scores(logits) -> scores`` as ``model.ffn.router=<name>``; ``sums_to_one``: whether a
    token's scores already sum to 1 (else the balance loss normalises them, DeepSeek-V3 eq. 19)."""

    def register(obj: Any) -> None:
        _claim("model.ffn.router", name, ROUTER_SCORES)
        ROUTER_SCORES[name] = RouterScoring(obj, sums_to_one=sums_to_one)

    return _decorate(register, scores)


def register_lr_scheduler(name: str, schedule: Callable | None = None, *, config: type | None = None) -> Any:
    """Register ``schedule(update, cfg, base_lr, d_model, max_updates) -> lr`` as ``lr_scheduler=<name>``.

    Args:
        name: the option.
        schedule: the function (omit to use this as a decorator).
        config: its own fields (a dataclass subclassing :class:`~transformer.config.SchedulerConfig`),
            read from ``cfg`` (``cfg.decay_fraction``).

    Raises:
        ConfigError: a taken name, or ``config`` not fitting the group.
    """

    def register(obj: Any) -> None:
        _claim("lr_scheduler", name, LR_SCHEDULERS)
        _options("lr_scheduler", name, config)
        SCHEDULES[name] = obj
        LR_SCHEDULERS.append(name)

    return _decorate(register, schedule)
