"""Command-line checks shared by the scripts (transformer/cli.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from transformer import cli


def test_a_missing_launcher_plugin_names_its_pip_install(monkeypatch):
    monkeypatch.setattr(cli, "_installed", lambda module: False)
    with pytest.raises(cli.MissingPlugin, match=r'hydra/launcher=submitit_slurm needs the hydra-submitit-launcher '
                                                 r'package, which is not installed: pip install -e "\.\[slurm\]"'):
        cli.check_hydra_plugins(["experiment=ladder", "hydra/launcher=submitit_slurm"])
    with pytest.raises(cli.MissingPlugin, match=r"hydra/sweeper=optuna needs the hydra-optuna-sweeper .*\[sweep\]"):
        cli.check_hydra_plugins(["hydra/sweeper=optuna"])
    cli.check_hydra_plugins(["hydra/launcher=basic", "model=transformer_tiny"])  # built in: nothing to check


def test_installed_plugins_pass_and_are_the_ones_hydra_finds():
    for module, _dist, _extra in cli.HYDRA_PLUGINS.values():
        assert cli._installed(module), f"{module} should be installed by the [dev] extra"
    cli.check_hydra_plugins(["hydra/launcher=joblib", "hydra/sweeper=optuna", "hydra/launcher=submitit_local"])


def test_train_script_refuses_a_missing_plugin_with_one_line(tmp_path):
    """In a real process: the plugin's module hidden (an empty hydra_plugins package first on the path)."""
    fake = tmp_path / "hydra_plugins"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    code = ("import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'scripts/train.py'; "
            "runpy.run_path('scripts/train.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), "hydra/launcher=joblib", "-m"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        'error: hydra/launcher=joblib needs the hydra-joblib-launcher package, which is not installed: '
        'pip install -e ".[sweep]" (or pip install hydra-joblib-launcher)']
