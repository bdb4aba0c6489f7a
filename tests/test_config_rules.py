"""The rules on the config's fields: which may change on resume (:data:`RESUME_OVERRIDES`), which
are always the command line's, and which do not define a configuration (:data:`IGNORED_KEYS`, what
``compare.py`` and ``train.finished_runs`` leave aside when they group runs)."""

from transformer.analysis.grouping import IGNORED_KEYS
from transformer.training.resume import _ALWAYS_FROM_COMMAND_LINE, RESUME_OVERRIDES

# The lists as they were written by hand before they were derived from the fields: the derivation
# must not change what a resume accepts nor how runs are grouped.
PINNED_RESUME_OVERRIDES = {
    "train.max_updates", "train.max_epochs", "train.max_time", "train.patience",
    "train.ema_decay",
    "train.log_every", "train.progress", "logger",
    "train.num_threads", "train.tune_malloc", "train.onednn_cache_capacity", "train.device",
    "train.distributed", "train.activation_checkpointing", "train.compile",
    "data.root", "data.cache_dir", "data.binarized", "data.download", "data.preprocess_workers",
    "train.resume", "train.resume_from", "train.finished_runs", "run_dir",
    "plugins", "plugins_trust",
}
PINNED_ALWAYS_FROM_COMMAND_LINE = {"train.resume", "train.resume_from", "run_dir"}
PINNED_IGNORED_KEYS = {
    "seed", "experiment_name", "run_dir",
    "data.root", "data.cache_dir", "data.download", "data.binarized", "data.preprocess_workers",
    "train.stop_signals", "train.device", "train.num_threads", "train.onednn_cache_capacity", "train.progress",
    "train.resume", "train.finished_runs", "train.log_every",
    "logger", "plugins", "plugins_trust",
}


def test_the_lists_are_the_ones_written_by_hand_before():
    assert isinstance(RESUME_OVERRIDES, tuple) and isinstance(IGNORED_KEYS, tuple)
    for names in (RESUME_OVERRIDES, IGNORED_KEYS, _ALWAYS_FROM_COMMAND_LINE):
        assert len(set(names)) == len(names), names
    assert set(RESUME_OVERRIDES) == PINNED_RESUME_OVERRIDES
    assert set(_ALWAYS_FROM_COMMAND_LINE) == PINNED_ALWAYS_FROM_COMMAND_LINE
    assert set(IGNORED_KEYS) == PINNED_IGNORED_KEYS
