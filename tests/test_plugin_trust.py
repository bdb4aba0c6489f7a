"""Trust comes only from the command line (transformer/plugins/): a run folder whose own
``config.yaml`` says ``plugins_trust: true`` and points ``plugins`` at its own copy of the plugin (with
matching hashes), as one received from someone else might, makes no command import that copy;
``plugins_trust=true`` on the command line does. A resume with ``plugins_trust=true`` records neither
the trust nor the copy's path.

The plugin here registers nothing the model uses and writes a marker file when imported, so each
command shows whether the folder's code ran, not only its exit status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO_ROOT, multi30k_excerpt, parallel_text_args

PROBE = """import os
from pathlib import Path

Path(os.environ["TRUST_PROBE_MARKER"]).write_text("imported", encoding="utf-8")
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> dict:
    """A tiny corpus, the probe plugin in the user's folder, and a run trained with it."""
    root = tmp_path_factory.mktemp("trust")
    corpus = multi30k_excerpt(root / "corpus", {"train": 200, "val": 10, "test_2016_flickr": 6})
    probe = root / "ideas" / "trust_probe"
    probe.mkdir(parents=True)
    (probe / "__init__.py").write_text(PROBE, encoding="utf-8")
    marker = root / "imported.txt"
    env = {**os.environ, "TRUST_PROBE_MARKER": str(marker)}
    home = {"root": root, "corpus": corpus, "probe": probe, "marker": marker, "env": env}
    run = root / "run"
    out = _run(home, "train.py", *_train_args(home, run))
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "plugins" / "trust_probe" / "__init__.py").read_text() == PROBE
    home["run"] = run
    return home


def _train_args(home: dict, run_dir: Path, *extra: str) -> list[str]:
    c = home["corpus"]
    return [
        f"plugins=[{home['probe']}]",
        *parallel_text_args(c, 200),
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        "model.d_model=32",
        "model.n_heads=4",
        "model.d_ff=64",
        "train.max_tokens=400",
        "train.max_updates=2",
        "train.max_time=0",
        "train.validate_every=2",
        "train.valid_bleu=false",
        "train.save_every=2",
        "train.progress=false",
        "train.num_threads=1",
        "train.precision=fp32",
        "lr_scheduler.warmup_updates=1",
        "generation.beam_size=1",
        "generation.max_len_b=4",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def _run(home: dict, script: str, *args: str) -> subprocess.CompletedProcess:
    home["marker"].unlink(missing_ok=True)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / script), *args],
        cwd=home["root"],
        env=home["env"],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _refused(home: dict, out: subprocess.CompletedProcess, *words: str) -> None:
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [ln for ln in lines if ln.startswith("error: ")]  # (a line saying which weights load may come first)
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert all(w in errors[0] for w in words), errors[0]
    assert not home["marker"].exists(), "the run folder's copy of the plugin was imported"


def _imported(home: dict, out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, out.stderr[-3000:]
    assert home["marker"].read_text() == "imported"


def _craft(run: Path, received: Path) -> Path:
    """A copy of ``run`` as someone else might send it: its config names its own copy of the plugin
    and says ``plugins_trust: true``; the original plugin folder is not on this machine."""
    shutil.copytree(run, received)
    for name in ("config.yaml", ".hydra/config.yaml"):
        path = received / name
        if path.is_file():
            cfg = OmegaConf.load(path)
            cfg.plugins = [str(received / "plugins" / "trust_probe")]
            cfg.plugins_trust = True
            OmegaConf.save(cfg, path)
    return received


@pytest.mark.slow
def test_a_run_folder_that_trusts_itself_is_refused_and_the_command_line_decides(home, tmp_path):
    moved = tmp_path / "moved_away"
    shutil.move(home["probe"], moved)
    try:
        run = _craft(home["run"], tmp_path / "received")
        src = tmp_path / "in.txt"
        src.write_text("A man rides a bike.\n", encoding="utf-8")
        words = ("lies in the run folder itself", "plugins_trust=true")
        translate = ("translate.py", f"checkpoint={run}", f"input={src}", "progress=false")
        evaluate = ("evaluate.py", f"checkpoint={run}", f"output_dir={tmp_path / 'eval'}", "progress=false")
        export = ("export.py", f"run={run}", "format=hf")
        resume = (
            "train.py",
            *[
                a
                for a in _train_args(home, run, "train.max_updates=3", "train.resume=true")
                if not a.startswith("plugins=")
            ],
        )
        for command in (translate, evaluate, (*export, f"out={tmp_path / 'hf_refused'}"), resume):
            _refused(home, _run(home, *command), *words)
        assert not (tmp_path / "hf_refused").exists()
        assert json.loads((run / "results.json").read_text())["updates"] == 2  # the refused resume trained nothing

        _imported(home, out := _run(home, *translate, "plugins_trust=true"))
        assert len(out.stdout.splitlines()) == 1
        _imported(home, _run(home, *evaluate, "plugins_trust=true"))
        _imported(home, _run(home, *export, f"out={tmp_path / 'hf'}", "plugins_trust=true"))
        assert (tmp_path / "hf" / "config.json").is_file()
        _imported(home, _run(home, *resume, "plugins_trust=true"))
        assert json.loads((run / "results.json").read_text())["updates"] == 3
        saved = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
        assert saved["plugins_trust"] is False  # trust is never written into the run
        _refused(home, _run(home, *translate), *words)  # and the next command needs it again
    finally:
        shutil.move(moved, home["probe"])


def test_a_trusted_resume_keeps_the_recorded_path_and_records_no_trust(home, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(home["run"], run)
    for name in ("config.yaml", ".hydra/config.yaml"):  # the copy's own run folder
        path = run / name
        if path.is_file():
            path.write_text(path.read_text().replace(str(home["run"]), str(run)), encoding="utf-8")
    moved = tmp_path / "moved_away"
    shutil.move(home["probe"], moved)
    try:
        args = [
            a
            for a in _train_args(home, run, "train.max_updates=3", "train.resume=true")
            if not a.startswith("plugins=")
        ]
        _refused(home, _run(home, "train.py", *args), "is not there any more", "plugins_trust=true")
        _imported(home, _run(home, "train.py", *args, "plugins_trust=true"))
        saved = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
        assert saved["plugins"] == [str(home["probe"])]  # where it was trained, not the run's copy
        assert saved["plugins_trust"] is False
        results = json.loads((run / "results.json").read_text())
        assert results["updates"] == 3 and results["config"]["plugins_trust"] is False
    finally:
        shutil.move(moved, home["probe"])


def test_a_recorded_plugin_without_hashes_is_imported_only_from_a_folder_the_user_names(tmp_path):
    from transformer.plugins import PluginError, import_recorded, set_user_choice

    elsewhere = tmp_path / "elsewhere" / "nohash_probe"
    elsewhere.mkdir(parents=True)
    (elsewhere / "__init__.py").write_text("IMPORTED = True\n", encoding="utf-8")
    config = {"plugins": [str(elsewhere)], "plugin_files": {}, "plugins_trust": True}
    set_user_choice([], trust=False)
    with pytest.raises(PluginError, match=r"without the hashes of its files .*plugins=\[<folder named nohash_probe>\]"):
        import_recorded(tmp_path / "run", config)
    assert "nohash_probe" not in sys.modules
    try:
        set_user_choice([str(elsewhere)])
        assert [p.name for p in import_recorded(tmp_path / "run", config)] == ["nohash_probe"]
    finally:
        set_user_choice([])
