"""The zoo's module checks as a kit, for any option of any group, built-in or a plugin's
(docs/plugins.md#the-checks-your-option-must-pass). Each check builds a tiny model of a family with
the option chosen and raises ``AssertionError`` with a sentence when its property fails:
incremental decoding, padding, search batching, causality, gradients, bf16, and
:func:`check_compiles`; :func:`check_schedule` holds a learning-rate schedule to its own. All at
once: :func:`check_option`, or ::

    python -m transformer.testing plugins=[examples/plugins/diff_attention] model/attention=diff
"""

from transformer.testing.checks import (
    CHECKS,
    check_bf16,
    check_causality,
    check_gradients,
    check_incremental_decoding,
    check_model,
    check_option,
    check_padding,
    check_search_batching,
)
from transformer.testing.cli import CHECKED, MODULES, main
from transformer.testing.compiles import check_compiles
from transformer.testing.models import ARCHS, tiny_model
from transformer.testing.schedules import check_schedule

__all__ = [
    "ARCHS",
    "CHECKED",
    "CHECKS",
    "MODULES",
    "check_bf16",
    "check_causality",
    "check_compiles",
    "check_gradients",
    "check_incremental_decoding",
    "check_model",
    "check_option",
    "check_padding",
    "check_schedule",
    "check_search_batching",
    "main",
    "tiny_model",
]
