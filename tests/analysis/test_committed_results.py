"""Old run folders keep loading: every run committed under ``docs/results/`` is read
by today's code as the tools read it, and every study's tables are what today's ``scripts/compare.py``
writes from them, byte for byte.

* Each folder with a ``results.json`` is read by the collector of ``compare.py``
  (:func:`~transformer.analysis.collect.load_run`) as a finished run: its name, seed and scores. A
  training run's ``config.yaml`` goes through :func:`~transformer.config.typed_config` as
  ``generation/loading.py`` reads it, and the model it describes has the parameter count the run
  reported. No checkpoints are committed, so the evaluations committed (``scripts/evaluate.py``
  folders, e.g. ``length/runs/rope_seed1_dynamic``) are what "evaluates" covers: they are read as runs
  of the model at their test-time settings.
* Each ``scripts/compare.py`` command a study README gives (parsed from the README, ``--out`` moved to a
  temporary folder) writes the ``.md`` / ``.csv`` files committed in its ``--out`` folder byte for byte
  (``docs/results/default_run``'s tables were regenerated with its README's command when ``compare.py``
  gained the active-parameter, machine and length-bucket columns and sections; its numbers did not move).
  The commands run in parallel subprocesses (about 90 s of CPU in all, mostly the bootstraps), started
  together by one fixture; the ladder's and the length study's are marked slow. The plots are not
  compared (PNG bytes depend on the matplotlib build).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO_ROOT, SHARED_DATA
from transformer.analysis.collect import find_run_dirs, load_run
from transformer.analysis.grouping import group_runs
from transformer.config import to_config, typed_config
from transformer.models import build_model

RESULTS = REPO_ROOT / "docs" / "results"
RUN_DIRS = sorted(p.parent for p in RESULTS.glob("**/results.json"))
STUDY_OUTS = ("branches", "default_run", "ladder", "length", "length/against_step5", "wu2021_tiny/seeds")
"""The ``--out`` folders of the ``compare.py`` commands the study READMEs give (a README that drops its
command fails :func:`test_every_study_readme_gives_its_compare_command`)."""
REFERENCES = SHARED_DATA / "multi30k" / "test_2016_flickr.de.gz"


def _rel(path: Path) -> str:
    return path.relative_to(RESULTS).as_posix()


def _n_params(cfg) -> int:
    """Parameters of the model ``cfg`` (a typed config) describes, with its recorded vocabulary size."""
    cfg = to_config(cfg)
    vocab = cfg.data.vocab_size
    joint = cfg.data.joint_vocab or cfg.model.arch == "decoder_only"
    return sum(p.numel() for p in build_model(cfg.model, vocab, None if joint else vocab).parameters())


def test_the_committed_runs_are_found():
    """Every committed training run has both files, and the glob finds the studies' runs and the evaluations."""
    configs = sorted(p.parent for p in RESULTS.glob("**/config.yaml"))
    assert configs and all((d / "results.json").is_file() for d in configs)
    assert len(configs) >= 32 and len(RUN_DIRS) - len(configs) >= 4, [_rel(d) for d in RUN_DIRS]  # 4 evaluations
    for study in ("ladder", "branches", "length"):  # compare.py's folder search finds the same runs
        assert find_run_dirs(RESULTS / study / "runs") == [d for d in RUN_DIRS if _rel(d).startswith(f"{study}/runs/")]


@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=_rel)
def test_a_committed_run_loads_as_a_run(run_dir):
    """Read by the collector: finished, one configuration with a label, the seed its folder names, the
    scores of its results.json; its config typed as the loaders type it, describing the model it reported."""
    raw = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    run = load_run(run_dir)
    assert run.ok and run.reason is None and run.config is not None
    configs, missing = group_runs([run])
    assert len(configs) == 1 and not missing and configs[0].label
    name = run_dir.name
    seed = re.search(r"(?:^|_)seed(\d+)", name)
    assert run.seed == (int(seed.group(1)) if seed else 1)
    stem = name[: seed.start()] if seed else ""
    assert not stem or stem in run.choices.values(), f"{name} does not name one of its choices {run.choices}"
    split = run.test_split
    assert split == "test_2016_flickr"
    assert (run.hyps_path() is not None) == ((run_dir / "hyps").is_dir() or run.evaluation)
    if run.evaluation:  # a scripts/evaluate.py folder: the model at its test-time settings
        assert not (run_dir / "config.yaml").exists() and run.results["checkpoint"] == raw["checkpoint"]
        assert (
            run.results["bleu"] == raw["splits"][split]["bleu"] and run.results["chrf"] == raw["splits"][split]["chrf"]
        )
        cfg = typed_config(raw["config"])
        assert _n_params(cfg) == raw["trained"]["params"]
        if not run.test_time:  # evaluate.py checkpoint=RUN of the training run beside it
            _assert_reproduces(run_dir.with_name(name.removesuffix(REPRODUCED)), run_dir, raw)
            return
        assert name.endswith(OmegaConf.select(OmegaConf.create(run.config), "model.position.rope_scaling.rope_type"))
        assert configs[0].label.endswith(" at test time")
        for override in run.test_time:
            key, value = override.split("=", 1)
            assert str(OmegaConf.select(cfg, key)) == value
    else:
        assert (run.results["bleu"], run.results["chrf"]) == (raw["bleu"], raw["chrf"])
        assert run.results["test"][split]["bleu"] == raw["bleu"] and 0 < raw["bleu"] < 100
        cfg = typed_config(OmegaConf.load(run_dir / "config.yaml"))
        assert cfg.seed == run.seed
        assert _n_params(cfg) == raw["params"]


REPRODUCED = "_evaluate"
"""The suffix of a committed ``scripts/evaluate.py checkpoint=RUN`` folder of the training run
``<name>`` beside it (``docs/results/ladder/reproduction/``)."""


def _assert_reproduces(trained_dir: Path, evaluated_dir: Path, evaluated: dict) -> None:
    """``evaluate.py checkpoint=RUN`` scored the weights the run's results.json names, and every split
    the run tested has the run's BLEU and chrF and its hypotheses, byte for byte."""
    trained = json.loads((trained_dir / "results.json").read_text(encoding="utf-8"))
    assert Path(evaluated["checkpoint"]).name == trained["test_weights"] == "checkpoint_avg.safetensors"
    assert evaluated["trained"]["final_model"] == trained["final_model"]
    assert evaluated["splits"].keys() == trained["test"].keys()
    for split, scores in trained["test"].items():
        assert (evaluated["splits"][split]["bleu"], evaluated["splits"][split]["chrf"]) == (
            scores["bleu"],
            scores["chrf"],
        )
        assert (evaluated_dir / f"{split}.txt").read_bytes() == (trained_dir / "hyps" / f"{split}.txt").read_bytes()


def test_a_committed_reproduction_is_there():
    """At least one committed study run is reproduced from its checkpoint by ``evaluate.py``."""
    reproduced = [d for d in RUN_DIRS if d.name.endswith(REPRODUCED)]
    assert reproduced and all(d.with_name(d.name.removesuffix(REPRODUCED)) in RUN_DIRS for d in reproduced)


def _compare_commands() -> dict[str, tuple[list[str], dict[str, str]]]:
    """``{out folder relative to docs/results: (argv, environment assignments)}`` of each
    ``scripts/compare.py`` command in a study README (in a code block or inline code)."""
    commands = {}
    for readme in sorted(RESULTS.glob("**/README.md")):
        text = readme.read_text(encoding="utf-8").replace("\\\n", " ")
        for found in re.finditer(r"((?:[A-Z_]+=\S+ )*python scripts/compare\.py[^\n`]*)", text):
            words = shlex.split(found.group(1))
            env = {}
            while "=" in words[0] and words[0] != "python":
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            out = words[words.index("--out") + 1]
            commands[_rel(REPO_ROOT / out)] = (words, env)
    return commands


COMMANDS = _compare_commands()


def test_every_study_readme_gives_its_compare_command():
    assert sorted(COMMANDS) == sorted(STUDY_OUTS)


@pytest.fixture(scope="module")
def compared(request, tmp_path_factory):
    """``{out: (process, tmp out folder, its output)}``: the selected studies' commands, started together."""
    selected = {
        item.callspec.params["out"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec") and "out" in item.callspec.params
    }
    started = {}
    for out in sorted(selected):
        words, env = COMMANDS[out]
        if "TRANSFORMER_DATA_DIR" in env and not REFERENCES.is_file():
            continue
        folder = tmp_path_factory.mktemp(out.replace("/", "_"))
        argv = [sys.executable if w == "python" else w for w in words]
        argv[argv.index("--out") + 1] = str(folder)
        run_env = {k: v for k, v in os.environ.items() if k != "TRANSFORMER_DATA_DIR"}
        if "TRANSFORMER_DATA_DIR" in env:  # the README's ../shared/data is the suite's data folder
            run_env["TRANSFORMER_DATA_DIR"] = str(SHARED_DATA)
        log = folder.parent / f"{folder.name}.log"  # a file, not a pipe: a process nobody reads yet never blocks
        with log.open("w") as f:
            started[out] = (
                subprocess.Popen(argv, cwd=REPO_ROOT, env=run_env, stdout=f, stderr=subprocess.STDOUT),
                folder,
                log,
            )
    yield started
    for proc, _, _ in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


SLOW = ("ladder", "length")
"""The two longest commands (about 27 s and 30 s of CPU each, of about 90 s in all): ``-m "not slow"``
leaves them out."""


@pytest.mark.parametrize("out", [pytest.param(o, marks=pytest.mark.slow) if o in SLOW else o for o in STUDY_OUTS])
def test_compare_py_rewrites_the_committed_tables(out, compared):
    """The study README's command writes each committed table (``.md`` / ``.csv``) byte for byte."""
    if out not in compared:
        pytest.skip(f"Multi30k references not found under {SHARED_DATA}")
    proc, folder, log = compared[out]
    assert proc.wait(timeout=600) == 0, log.read_text(encoding="utf-8")[-2000:]
    written = sorted(p.name for p in folder.iterdir() if p.suffix in (".md", ".csv"))
    assert {"comparison.md", "comparison.csv", "runs.csv"} <= set(written)
    for name in written:
        committed = RESULTS / out / name
        assert committed.is_file(), f"compare.py writes {name}, not committed in docs/results/{out}"
        assert (folder / name).read_bytes() == committed.read_bytes(), (
            f"docs/results/{out}/{name} is not what its README's compare.py command writes today"
        )
