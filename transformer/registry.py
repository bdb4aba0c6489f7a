"""The public registration API: a plugin adds options to the tables the built-in options live in.

One function per group, each usable as a decorator or called with the part. An option with fields
of its own passes ``config=``, a dataclass subclassing the group's; its fields live under the
group's node, define the configuration and are fixed on resume. Each group's contract (constructor
and interface): docs/plugins.md#writing-a-plugin.

Every function raises :class:`~transformer.config.ConfigError` for a name that a built-in option or
another plugin already holds, naming both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra.core.config_store import ConfigStore
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
from transformer.training.monitoring.loggers import LOGGERS, LoggerFactory
from transformer.training.step.schedules import SCHEDULES

__all__ = [
    "register_attention",
    "register_ffn",
    "register_logger",
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
    """``n_kv_heads`` (a divisor of ``n_heads``), or ``n_heads`` when null."""
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
    """Register a self-attention class as ``model/attention=<name>``.

    Args:
        config: its own fields (a dataclass subclassing :class:`~transformer.config.AttentionConfig`).
        kv_heads: ``(n_heads, n_kv_heads or None) -> key/value heads``, raising ``ValueError`` when they
            do not fit (default: ``n_kv_heads`` dividing ``n_heads``, null = ``n_heads``).
        cache_values: ``(n_heads, n_kv_heads, head_dim, config) -> values one layer caches per token``
            (None: unknown).
        cost: ``(d_model, n_heads, n_kv_heads, head_dim, config) -> (projection weights of one layer,
            query/key width, value width over all heads)`` (None: unknown FLOPs).

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
    """Register a feed-forward block class as ``model/ffn=<name>`` with the activation it applies.

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
    """Register a norm class as ``model/norm=<name>`` (and ``model.qk_norm=<name>``).

    Raises:
        ConfigError: a taken name, ``config`` on a class without ``from_sizes``, or ``config`` not
            fitting the group.
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
    """Register a RoPE scaling class or function as ``model.position.rope_scaling.rope_type=<name>``.

    Raises:
        ConfigError: a taken name, ``config`` on a class without ``from_sizes``, or ``config`` not
            fitting the group.
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
    """Register ``scores(logits) -> scores`` as ``model.ffn.router=<name>``; ``sums_to_one``: a
    token's scores already sum to 1 (else the balance loss normalises them, DeepSeek-V3 eq. 19)."""

    def register(obj: Any) -> None:
        _claim("model.ffn.router", name, ROUTER_SCORES)
        ROUTER_SCORES[name] = RouterScoring(obj, sums_to_one=sums_to_one)

    return _decorate(register, scores)


def register_lr_scheduler(name: str, schedule: Callable | None = None, *, config: type | None = None) -> Any:
    """Register ``schedule(update, cfg, base_lr, d_model, max_updates) -> lr`` as ``lr_scheduler=<name>``.

    Raises:
        ConfigError: a taken name, or ``config`` not fitting the group.
    """

    def register(obj: Any) -> None:
        _claim("lr_scheduler", name, LR_SCHEDULERS)
        _options("lr_scheduler", name, config)
        SCHEDULES[name] = obj
        LR_SCHEDULERS.append(name)

    return _decorate(register, schedule)


def register_logger(name: str, factory: LoggerFactory | None = None) -> Any:
    """Register ``factory(cfg, run_dir, run_name, config_dict) -> MetricsLogger`` as ``logger=<name>``:
    the logger written beside ``metrics.jsonl`` on rank 0 (``cfg``: the ``logger`` node; ``run_dir``: a
    ``Path``; ``config_dict``: the resolved config as plain containers). It is called with
    ``log(metrics, step, split)`` every ``train.log_every`` updates, after each validation and after
    the test, and closed at the end of the run
    (:class:`~transformer.training.monitoring.loggers.MetricsLogger`).

    Raises:
        ConfigError: a taken name.
    """

    def register(obj: Any) -> None:
        _claim("logger", name, LOGGERS)
        LOGGERS[name] = obj
        ConfigStore.instance().store(group="logger", name=name, node={"name": name})

    return _decorate(register, factory)
