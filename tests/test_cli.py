"""Command-line checks shared by the scripts (transformer/cli.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from transformer import cli


def test_a_missing_launcher_plugin_names_its_pip_install(monkeypatch):
    monkeypatch.setattr(cli, "_installed", lambda module: False)
    with pytest.raises(
        cli.MissingPlugin,
        match=r"hydra/launcher=submitit_slurm needs the hydra-submitit-launcher "
        r'package, which is not installed: pip install -e "\.\[slurm\]"',
    ):
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
    code = (
        "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'scripts/train.py'; "
        "runpy.run_path('scripts/train.py', run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), "hydra/launcher=joblib", "-m"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: hydra/launcher=joblib needs the hydra-joblib-launcher package, which is not installed: "
        'pip install -e ".[sweep]" (or pip install hydra-joblib-launcher)'
    ]


# ----------------------------------------------------------------------------- user_errors


class _Config(ValueError):
    pass


class _Data(ValueError):
    pass


def _exit_status(block, capsys, **kwargs) -> tuple[int, list[str]]:
    """Run ``block`` inside ``cli.user_errors({_Config: 2, (_Data, FileNotFoundError): 1})``:
    ``(exit status, stderr lines)``."""
    with pytest.raises(SystemExit) as exc:
        with cli.user_errors({_Config: 2, (_Data, FileNotFoundError): 1}, **kwargs):
            block()
    return exc.value.code, capsys.readouterr().err.splitlines()


def _raise(err: BaseException):
    def block():
        raise err

    return block


def test_a_user_error_is_one_line_and_its_status(capsys):
    assert _exit_status(_raise(_Config("bad\n  value:   3")), capsys) == (2, ["error: bad value: 3"])
    assert _exit_status(_raise(_Data("no such split")), capsys) == (1, ["error: no such split"])
    assert _exit_status(_raise(FileNotFoundError("file not found: x")), capsys) == (1, ["error: file not found: x"])
    status, err = _exit_status(_raise(_Data("x")), capsys, prefix="tool.py: error: ")
    assert (status, err) == (1, ["tool.py: error: x"])


def test_the_first_matching_entry_wins(capsys):
    with pytest.raises(SystemExit) as exc:
        with cli.user_errors({_Data: 1, ValueError: 2}):
            raise _Data("specific first")
    assert exc.value.code == 1
    with pytest.raises(SystemExit) as exc:
        with cli.user_errors({_Data: 1, ValueError: 2}):
            raise ValueError("the general one")
    assert exc.value.code == 2 and capsys.readouterr().err == "error: specific first\nerror: the general one\n"


def test_other_exceptions_and_exits_pass_through(capsys):
    with pytest.raises(KeyError):
        with cli.user_errors({_Config: 2}):
            raise KeyError("a bug: its traceback is shown")
    with pytest.raises(SystemExit) as exc:
        with cli.user_errors({_Config: 2}):
            sys.exit(75)  # e.g. train.py's polite stop
    assert exc.value.code == 75
    with cli.user_errors({_Config: 2}):
        pass  # nothing raised: nothing happens
    assert capsys.readouterr().err == ""


def test_hydra_full_error_reraises_the_error_itself(monkeypatch, capsys):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    seen = []
    err = _Config("bad value")
    with pytest.raises(_Config) as exc:
        with cli.user_errors({_Config: 2}, on_error=seen.append):
            raise err
    assert exc.value is err and seen == [err] and capsys.readouterr().err == ""


def test_in_a_multirun_the_job_raises_after_its_line(monkeypatch, capsys):
    """A failed job of a sweep must not exit the process: Hydra runs the other jobs."""
    assert cli.in_multirun() is False  # not under Hydra
    monkeypatch.setattr(cli, "in_multirun", lambda: True)
    seen = []
    with pytest.raises(cli.RunFailed, match="^no such split$") as exc:
        with cli.user_errors({_Data: 1}, on_error=seen.append):
            raise _Data("no such split")
    assert exc.value.__cause__ is None and exc.value.__suppress_context__
    assert capsys.readouterr().err == "error: no such split\n" and [str(e) for e in seen] == ["no such split"]


def test_on_error_runs_before_the_line(capsys):
    order = []
    with pytest.raises(SystemExit):
        with cli.user_errors({_Config: 2}, on_error=lambda e: order.append(("hook", capsys.readouterr().err))):
            raise _Config("x")
    assert order == [("hook", "")] and capsys.readouterr().err == "error: x\n"


def test_a_closed_stdout_exits_quietly_only_when_asked(capsys):
    with pytest.raises(SystemExit) as exc:
        with cli.user_errors({_Config: 2}, broken_pipe=0):
            raise BrokenPipeError(32, "Broken pipe")
    assert exc.value.code == 0 and capsys.readouterr().err == ""
    with pytest.raises(BrokenPipeError):
        with cli.user_errors({_Config: 2}):
            raise BrokenPipeError(32, "Broken pipe")


def test_an_error_raised_in_a_plugins_code_is_one_line_naming_it_where_asked(tmp_path, capsys):
    """``user_errors(..., plugins=2)``: what a loaded plugin's code raises (not a listed user error)
    names the plugin, its file and line; without ``plugins=``, and outside a plugin's code, it passes."""
    from transformer.plugins import import_plugins

    folder = tmp_path / "cli_bug_probe"
    folder.mkdir()
    (folder / "__init__.py").write_text("def fail(err):\n    raise err\n")
    (plugin,) = import_plugins([folder])
    fail = sys.modules[plugin.module].fail
    status, err = _exit_status(lambda: fail(RuntimeError("my bug\n  here")), capsys, plugins=2)
    assert (status, err) == (
        2,
        [f"error: the plugin cli_bug_probe failed at {folder / '__init__.py'}:2: RuntimeError: my bug here"],
    )
    assert _exit_status(lambda: fail(_Data("a listed error")), capsys, plugins=2) == (1, ["error: a listed error"])
    with pytest.raises(RuntimeError, match="my bug"):
        with cli.user_errors({_Config: 2}):
            fail(RuntimeError("my bug"))
    with pytest.raises(KeyError):
        with cli.user_errors({_Config: 2}, plugins=2):
            raise KeyError("the zoo's own bug: its traceback is shown")
    assert capsys.readouterr().err == ""


def test_a_sweep_whose_jobs_were_refused_ends_with_one_line_counting_them(tmp_path):
    """Both jobs of a multirun refused at validation: each prints its line, the sweep ends with one
    line counting the jobs (no traceback, no Hydra "Error executing job"), exit status 1, and
    compare.py lists each job with its state and line."""
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "train.py"),
            "-m",
            "model.n_heads=3,5",
            "train.max_updates=1",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    refusal = "invalid configuration: model.d_model=256 is not divisible by model.n_heads={}"
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert out.returncode == 1 and "Traceback" not in out.stderr and "Error executing" not in out.stderr, out.stderr
    assert lines[-1] == (
        f"error: 0 of 2 jobs finished; 2 refused: n_heads=3: {refusal.format(3)}; n_heads=5: {refusal.format(5)} "
        f"(each job: {sweep / 'jobs.jsonl'}; compare.py lists them)"
    ), out.stderr
    compared = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "compare.py"), str(sweep), "--out", str(tmp_path / "cmp")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compared.returncode == 1, compared.stderr  # no finished run: the outputs list why
    assert "## Runs without results (2)" in compared.stdout
    assert f"- `{sweep / 'n_heads=3'}`: refused: {refusal.format(3)}" in compared.stdout, compared.stdout
