"""Typed configuration for every experiment.

The dataclasses here mirror the YAML files under ``configs/`` one to one (torchtitan style): Hydra
validates each YAML file against them through the ConfigStore (:func:`register_configs`), and
:func:`validate_config` rejects invalid *combinations* of fields before anything is built, with a
sentence that names the fields.

Modules in :mod:`transformer.modules` never see these classes; the builder
(:mod:`transformer.models.builder`) turns a :class:`ModelConfig` into explicit sizes and parts.

Where things are: :mod:`.schema` (the dataclasses and their ConfigStore registration),
:mod:`.rules` (what each field declares: may it change on resume, does it define a configuration),
:mod:`.runtime` (the time budget, ``train.resume``'s values, the ``zoo.hydra_subdir`` resolver, a sweep job's folder name: ``zoo.swept``),
:mod:`.options` (the groups whose options carry fields of their own, and Hydra's ConfigStore),
:mod:`.convert` (Hydra's DictConfig -> the typed :class:`Config`, once per script, and back to
plain data; older stored shapes upgraded), :mod:`.sizes` (head width, key/value heads, feed-forward width: the sizes a model config implies),
:mod:`.checks` (the checks of field combinations; the options of each switch come from the
tables beside the classes, e.g. :data:`transformer.modules.ffn.FFNS`), :mod:`.diff`
(:func:`config_differences`: the fields where two configs differ), :mod:`.fields` (an unknown key
or option refused by name with the nearest known ones, on a composed config or a command line before
Hydra runs), :mod:`.identity` (what makes two runs the same configuration, for ``compare.py``,
``train.finished_runs`` and a resume's plugin code).
"""

from omegaconf import MISSING

from transformer.config import checks, convert, diff, fields, identity, options, rules, runtime, schema, sizes
from transformer.config.checks import (
    check_checkpoint_averaging,
    signal_number,
    validate_config,
    validate_generation_config,
    validate_model_config,
    validate_moe_config,
    validate_optim_config,
    validate_option_fields,
)
from transformer.config.convert import (
    FLAT_ATTENTION_FIELDS,
    config_dict,
    to_config,
    to_generation_config,
    typed_config,
    upgrade_config,
)
from transformer.config.diff import config_differences
from transformer.config.fields import (
    UnknownOption,
    check_command_line,
    check_known_fields,
    unknown_field_sentence,
    unknown_fields,
    unknown_option_sentence,
)
from transformer.config.identity import (
    IGNORED_KEYS,
    config_identity,
    flatten_config,
    identity_key,
    is_ignored,
    used_plugin_files,
    with_defaults,
)
from transformer.config.options import (
    GROUPS,
    LR_SCHEDULERS,
    OptionGroup,
    flat_group_override,
    option_config,
    register_configs,
    register_option_config,
    store_option_schemas,
    store_plugin_option,
    structured_config,
)
from transformer.config.rules import (
    GROUPINGS,
    RESUMES,
    FieldRule,
    field_rule,
    keys_with,
    recipe,
    rule,
    rule_table,
    undeclared,
)
from transformer.config.runtime import (
    DEFAULT_TIME_BUDGET_S,
    RESUME_MODES,
    SWEPT_KEYS_ENV,
    budget_sentence,
    resume_mode,
    sweep_subdir,
    swept_keys,
    swept_suffix,
    time_budget,
)
from transformer.config.schema import (
    AttentionConfig,
    Config,
    ConfigError,
    CriterionConfig,
    DataConfig,
    FFNConfig,
    GenerationConfig,
    GenerationOverrides,
    LatentAttentionConfig,
    LoggerConfig,
    ModelConfig,
    NormConfig,
    OptimConfig,
    PositionConfig,
    RopeScalingConfig,
    RopeScalingOverrides,
    SchedulerConfig,
    TrainConfig,
)
from transformer.config.sizes import (
    LatentSizes,
    ModelSizes,
    ffn_size,
    head_dim,
    kv_cache_values,
    latent_sizes,
    layer_windows,
    model_sizes,
    resolve_n_kv_heads,
    rope_scaling,
)

__all__ = [
    "MISSING",
    *convert.__all__,
    *diff.__all__,
    *fields.__all__,
    *identity.__all__,
    *options.__all__,
    *rules.__all__,
    *runtime.__all__,
    *schema.__all__,
    *sizes.__all__,
    *checks.__all__,
]

# the structured configs the YAML files name (base_config, generation_overrides) are known to Hydra
# as soon as the package is imported
register_configs()
