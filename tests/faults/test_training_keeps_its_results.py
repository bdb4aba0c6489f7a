"""A finished training is never thrown away by its final test, and invalid optimiser settings
(``optim.lr``) fail before any work."""

from __future__ import annotations

import json

import pytest

from tests.faults.conftest import SIZES, run_script, small_cli_args, small_config
from transformer.training.job.run import train

MAX_POSITIONS = 24


def test_lines_longer_than_learned_positions_do_not_lose_the_training(gappy_corpus, tmp_path):
    """Training pairs over the limit are filtered; validation and test lines over it cannot be
    translated: they are reported, left empty, and results.json is written."""
    run = tmp_path / "run"
    cfg = small_config(
        gappy_corpus,
        run,
        "model/position=learned",
        f"model.max_positions={MAX_POSITIONS}",
        f"data.max_source_positions={MAX_POSITIONS - 1}",
        f"data.max_target_positions={MAX_POSITIONS - 1}",
        "train.max_updates=2",
        "train.validate_every=2",
        "train.valid_bleu_subset=0",
    )
    results = train(cfg)
    saved = json.loads((run / "results.json").read_text())
    assert saved["updates"] == 2 and saved["bleu"] == results["bleu"]
    failed = saved["test"]["test_2016_flickr"]["failed_lines"]
    assert failed, "the slice has test lines longer than 23 pieces"
    hyps = (run / "hyps" / "test_2016_flickr.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == SIZES["test_2016_flickr"] and all(hyps[i - 1] == "" for i in failed)


def test_negative_learning_rate_fails_before_the_data_is_read(tmp_path):
    from transformer.config import ConfigError, validate_config

    cfg = small_config(tmp_path / "no_corpus", tmp_path / "run", "optim.lr=-1")
    with pytest.raises(ConfigError, match="optim.lr"):
        validate_config(cfg)
    res = run_script(
        "train",
        *small_cli_args(tmp_path / "no_corpus", tmp_path / "run", "optim.lr=-1", f"hydra.run.dir={tmp_path / 'run'}"),
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "optim.lr" in res.stderr and "Traceback" not in res.stderr
    assert "no_corpus" not in res.stderr  # no data was looked for


FAILING_LOGGER = """from transformer.registry import register_logger
from transformer.training.monitoring.loggers import MetricsLogger


@register_logger("failing")
class Failing(MetricsLogger):
    def __init__(self, cfg, run_dir, run_name, config):
        pass

    def log(self, metrics, step, split):
        if split == "test" and {in_test}:
            raise ValueError("the tracking server refused the test row")

    def close(self):
        if not {in_test}:
            raise OSError("the tracking server went away")
"""


@pytest.mark.parametrize("in_test", [True, False], ids=["test-row", "close"])
def test_a_plugin_logger_failing_after_training_keeps_the_trained_folder(in_test, gappy_corpus, tmp_path):
    """A plugin's metrics logger that raises on the test row or when closed ends the command in one
    line naming the plugin; the checkpoints and logs the run trained stay."""
    plugin = tmp_path / "my_ideas" / "failing"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(FAILING_LOGGER.format(in_test=in_test))
    run = tmp_path / "run"
    args = small_cli_args(gappy_corpus, run, "train.max_updates=2", f"plugins=[{plugin}]", "logger=failing")
    res = run_script("train", *args, f"hydra.run.dir={run}", cwd=tmp_path)
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and err[-1].startswith("error: the plugin failing failed at"), err[-5:]
    assert "tracking server" in err[-1]
    assert (run / "checkpoint_last.pt").is_file() and (run / "metrics.jsonl").is_file(), sorted(run.iterdir())
