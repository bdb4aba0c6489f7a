"""The rules on the config's fields: which may change on resume (:data:`RESUME_OVERRIDES`), which
are always the command line's, and which do not define a configuration (:data:`IGNORED_KEYS`, what
``compare.py`` and ``train.finished_runs`` leave aside when they group runs)."""

import dataclasses
import re
from typing import get_type_hints

import pytest

from tests.conftest import REPO_ROOT
from transformer.config import (
    GROUPS,
    IGNORED_KEYS,
    Config,
    FieldRule,
    LatentAttentionConfig,
    config_dict,
    field_rule,
    flatten_config,
    keys_with,
    recipe,
    rule,
    rule_table,
    schema,
    undeclared,
)
from transformer.training.job.resume import _ALWAYS_FROM_COMMAND_LINE, RESUME_OVERRIDES

# The lists as they were written by hand before they were derived from the fields: the derivation
# must not change what a resume accepts nor how runs are grouped.
PINNED_RESUME_OVERRIDES = {
    "train.max_updates",
    "train.max_epochs",
    "train.max_time",
    "train.patience",
    "train.ema_decay",
    "train.log_every",
    "train.progress",
    "logger",
    "train.num_threads",
    "train.tune_malloc",
    "train.onednn_cache_capacity",
    "train.prefetch",
    "train.device",
    "train.distributed",
    "train.activation_checkpointing",
    "train.bucket_cap_mb",
    "train.static_graph",
    "train.grad_reduce_dtype",
    "train.reshard_after_forward",
    "train.dist_timeout",
    "train.compile",
    "data.root",
    "data.cache_dir",
    "data.binarized",
    "data.download",
    "data.preprocess_workers",
    "train.resume",
    "train.resume_from",
    "train.finished_runs",
    "run_dir",
    "plugins",
    "plugins_trust",
}
PINNED_ALWAYS_FROM_COMMAND_LINE = {"train.resume", "train.resume_from", "run_dir"}
PINNED_IGNORED_KEYS = {
    "seed",
    "experiment_name",
    "run_dir",
    "data.root",
    "data.cache_dir",
    "data.download",
    "data.binarized",
    "data.preprocess_workers",
    "train.stop_signals",
    "train.device",
    "train.num_threads",
    "train.onednn_cache_capacity",
    "train.prefetch",
    "train.bucket_cap_mb",
    "train.static_graph",
    "train.reshard_after_forward",
    "train.dist_timeout",
    "train.progress",
    "train.resume",
    "train.finished_runs",
    "train.log_every",
    "logger",
    "plugins",
    "plugins_trust",
}


def test_the_lists_are_the_ones_written_by_hand_before():
    """A field declared other than ``recipe`` changes a list: add it to the pinned sets above too, so
    that the change is deliberate and shows in the diff."""
    assert isinstance(RESUME_OVERRIDES, tuple) and isinstance(IGNORED_KEYS, tuple)
    for names in (RESUME_OVERRIDES, IGNORED_KEYS, _ALWAYS_FROM_COMMAND_LINE):
        assert len(set(names)) == len(names), names
    assert set(RESUME_OVERRIDES) == PINNED_RESUME_OVERRIDES
    assert set(_ALWAYS_FROM_COMMAND_LINE) == PINNED_ALWAYS_FROM_COMMAND_LINE
    assert set(IGNORED_KEYS) == PINNED_IGNORED_KEYS


def test_every_field_of_the_schema_declares_its_rule():
    missing = undeclared(Config)
    assert missing == [], (
        "fields without a rule: " + ", ".join(missing) + ". Declare one where the field is declared: "
        "`recipe(default)` (fixed on resume, defines the configuration) or `rule(default, resume=..., "
        "grouping=...)` (transformer/config/rules.py)"
    )


def test_a_new_field_without_a_rule_is_named():
    @dataclasses.dataclass
    class Inner:
        kept: int = recipe(1)
        new_switch: int = 0

    @dataclasses.dataclass
    class Root:
        inner: Inner = dataclasses.field(default_factory=Inner)
        where: str = rule("x", resume="free", grouping="ignored")

    assert undeclared(Root) == ["inner.new_switch (Inner.new_switch)"]
    assert keys_with(Root, resume=("free",)) == ("where",)
    assert keys_with(Root, grouping=("defines",)) == ("inner.kept",)
    with pytest.raises(ValueError, match="resume='sometimes' is not one of fixed, free, always"):
        rule(1, resume="sometimes", grouping="ignored")


def test_the_rule_table_covers_every_key_of_the_config():
    table = rule_table(Config)
    keys = flatten_config(config_dict(Config()))
    assert all(any(k == t or k.startswith(t + ".") for t in table) for k in keys), sorted(set(keys) - set(table))
    for key in table:  # a rule on a dataclass node covers it: the fields below declare none
        node = Config
        for part in key.split("."):
            node = get_type_hints(node)[part]
        if dataclasses.is_dataclass(node):
            assert all(field_rule(f) is None for f in dataclasses.fields(node)), key


def test_an_options_own_fields_define_the_configuration_and_are_fixed_on_resume():
    builtin = [cls for g in GROUPS.values() for cls in g.options.values() if cls.__module__ == schema.__name__]
    assert LatentAttentionConfig in builtin
    for cls in builtin:
        rules = {f.name: field_rule(f) for f in dataclasses.fields(cls)}
        assert rules == {name: FieldRule("fixed", "defines") for name in rules}, cls.__name__


def test_the_resume_page_lists_the_fields_a_resume_may_change():
    """docs/runs.md names them (``logger.*`` for the node), so the page follows the declarations."""
    text = " ".join((REPO_ROOT / "docs" / "runs.md").read_text(encoding="utf-8").split())
    start = text.index("Each field declares whether a resume may change it")
    sentence = text[start : text.index("may change on resume", start)]
    listed = {name.removesuffix(".*") for name in re.findall(r"`([a-z_.*]+)`", sentence)}
    assert listed == set(RESUME_OVERRIDES) - set(_ALWAYS_FROM_COMMAND_LINE)
