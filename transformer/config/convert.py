"""From Hydra's DictConfig to the typed :class:`~transformer.config.Config`, once, where a script
receives it; and back to plain data for files (``config.yaml``, ``results.json``, checkpoints)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer.config.schema import Config, ConfigError, GenerationConfig

__all__ = ["config_dict", "to_config", "to_generation_config"]


def _typed(schema: type, cfg: Any) -> Any:
    if isinstance(cfg, DictConfig):  # Hydra's own settings are not part of the schema
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
    except Exception as e:  # omegaconf's errors name the key
        raise ConfigError(f"invalid {schema.__name__}: {e}".splitlines()[0]) from e


def to_config(cfg: Config | DictConfig | dict[str, Any]) -> Config:
    """The typed config of a composed Hydra config: interpolations resolved, every value checked
    against :class:`Config`; missing fields take the dataclass defaults.

    Args:
        cfg: a :class:`Config` (returned as is), a DictConfig (``hydra`` key ignored) or a dict.

    Raises:
        ConfigError: a field the schema does not have or a value of the wrong type (named).
    """
    return cfg if isinstance(cfg, Config) else _typed(Config, cfg)


def to_generation_config(cfg: GenerationConfig | DictConfig | dict[str, Any] | None) -> GenerationConfig:
    """The typed generation settings: a :class:`GenerationConfig` as is, a DictConfig / dict with
    some of its fields over the defaults, None for the defaults.

    Raises:
        ConfigError: a field :class:`GenerationConfig` does not have or a value of the wrong type.
    """
    if isinstance(cfg, GenerationConfig):
        return cfg
    return _typed(GenerationConfig, {} if cfg is None else cfg)


def config_dict(cfg: Any) -> dict[str, Any]:
    """``cfg`` (a dataclass config, DictConfig or dict) as plain resolved containers (tuples as
    lists), e.g. for ``results.json``, ``config.yaml`` and the training state."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg) if not isinstance(cfg, dict) else OmegaConf.create(cfg)
    return OmegaConf.to_container(node, resolve=True)
