"""From Hydra's DictConfig to the typed :class:`~transformer.config.Config`, once, where a script
receives it; back to plain data for files (``config.yaml``, ``results.json``, checkpoints); and a
stored config of an older shape to this version's (:func:`upgrade_config`)."""

from __future__ import annotations

import copy
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer.config.options import structured_config
from transformer.config.schema import Config, ConfigError, GenerationConfig

__all__ = [
    "FLAT_ATTENTION_FIELDS",
    "config_dict",
    "to_config",
    "to_generation_config",
    "typed_config",
    "upgrade_config",
]

FLAT_ATTENTION_FIELDS = (
    "n_kv_heads",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
"""The ``model.*`` fields that moved under ``model.attention`` when the attention switch became a
group like the others (configs saved before carry ``model.attention: gqa`` and these flat)."""


def upgrade_config(cfg: Any) -> Any:
    """A stored config (whole, or a model config) in this version's shape; the input is not changed.

    A flat ``model.attention: <name>`` with ``model.n_kv_heads`` and latent sizes beside it becomes
    the ``model.attention`` node (latent sizes kept for ``mla`` only); a ``train`` node without
    ``pad_to_multiple`` gets ``1``, what those runs did. Returns ``cfg`` itself when nothing moves,
    else a plain dict."""
    if not isinstance(cfg, (dict, DictConfig)):
        return cfg
    whole = isinstance(cfg.get("model"), (dict, DictConfig))
    model = cfg["model"] if whole else cfg
    train = cfg.get("train") if whole else None
    old_batching = isinstance(train, (dict, DictConfig)) and "max_tokens" in train and "pad_to_multiple" not in train
    if (
        not isinstance(model.get("attention"), str)
        and not any(k in model for k in FLAT_ATTENTION_FIELDS)
        and not old_batching
    ):
        return cfg
    cfg = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else copy.deepcopy(cfg)
    if old_batching:  # recorded before train.pad_to_multiple existed: trained with greedy batches, no rounding
        cfg["train"]["pad_to_multiple"] = 1
    model = cfg["model"] if whole else cfg
    if not isinstance(model.get("attention"), str) and not any(k in model for k in FLAT_ATTENTION_FIELDS):
        return cfg
    attention = model.pop("attention", None)
    node = dict(attention) if isinstance(attention, dict) else {"name": "mha" if attention is None else attention}
    flat = {k: model.pop(k) for k in FLAT_ATTENTION_FIELDS if k in model}
    node.setdefault("n_kv_heads", flat.pop("n_kv_heads", None))
    if node["name"] == "mla":
        for k, v in flat.items():
            node.setdefault(k, v)
    model["attention"] = node
    return cfg


def typed_config(cfg: Any = None) -> DictConfig:
    """A stored or composed config as a DictConfig over :class:`~transformer.config.Config`: upgraded,
    each group typed by its option, missing fields at their defaults, interpolations kept.

    Raises:
        ConfigError: a field the schema lacks, or a mistyped value.
    """
    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    cfg = upgrade_config({} if cfg is None else cfg)
    try:
        return OmegaConf.merge(structured_config(cfg), cfg)
    except ConfigError:
        raise
    except Exception as e:  # omegaconf's errors name the key
        raise ConfigError(f"does not fit this version's Config: {e}".splitlines()[0]) from None


def _typed(schema: type, cfg: Any) -> Any:
    if isinstance(cfg, DictConfig):  # Hydra's own settings are not part of the schema
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    try:
        if schema is Config:
            cfg = upgrade_config(cfg)
            return OmegaConf.to_object(OmegaConf.merge(structured_config(cfg), cfg))
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
    except ConfigError:
        raise
    except Exception as e:  # omegaconf's errors name the key
        raise ConfigError(f"invalid {schema.__name__}: {e}".splitlines()[0]) from e


def to_config(cfg: Config | DictConfig | dict[str, Any]) -> Config:
    """The typed :class:`Config` of a composed or stored config (a :class:`Config` as is; ``hydra``
    ignored): interpolations resolved, upgraded, checked, missing fields at their defaults.

    Raises:
        ConfigError: a field the schema does not have or a value of the wrong type (named).
    """
    return cfg if isinstance(cfg, Config) else _typed(Config, cfg)


def to_generation_config(cfg: GenerationConfig | DictConfig | dict[str, Any] | None) -> GenerationConfig:
    """The typed :class:`GenerationConfig` of one, of a mapping of some of its fields, or of None.

    Raises:
        ConfigError: a field it does not have or a value of the wrong type.
    """
    if isinstance(cfg, GenerationConfig):
        return cfg
    return _typed(GenerationConfig, {} if cfg is None else cfg)


def config_dict(cfg: Any) -> dict[str, Any]:
    """``cfg`` (a dataclass config, DictConfig or dict) as plain resolved containers (tuples as
    lists), e.g. for ``results.json``, ``config.yaml`` and the training state."""
    node = (
        cfg
        if isinstance(cfg, DictConfig)
        else OmegaConf.structured(cfg)
        if not isinstance(cfg, dict)
        else OmegaConf.create(cfg)
    )
    return OmegaConf.to_container(node, resolve=True)
