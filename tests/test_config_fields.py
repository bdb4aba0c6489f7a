"""An unknown key is refused before any work (transformer/config/fields.py): an override with
Hydra's ``+`` or without, a key of an experiment's or a plugin's YAML, in one run or in every job of a
multirun; one line naming the key and the nearest known fields, exit status 2, no folder."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import REPO_ROOT
from tests.training.conftest import small_cli_args, small_corpus  # noqa: F401 (fixture)
from transformer.config import (
    SWEPT_KEYS_ENV,
    ConfigError,
    UnknownOption,
    check_command_line,
    register_configs,
    unknown_fields,
    validate_config,
)
from transformer.plugins import ORIGINS, command_line_plugins
from transformer.training.command import prepare_command_line

CONFIGS = REPO_ROOT / "configs"
DIFF = REPO_ROOT / "examples" / "plugins" / "diff_attention"


def _refused(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        check_command_line(argv, CONFIGS, "train")
    return str(err.value)


@pytest.mark.parametrize(
    "argv,words",
    [
        (
            ["+train.max_updatez=5", "train.max_updates=1"],
            "train.max_updatez is not a field of train; did you mean train.max_updates",
        ),
        (
            ["model.ffn.tau=0.5"],
            "model.ffn.tau is not a field of model.ffn (model/ffn=relu)",
        ),  # Hydra's "+" hint answered
        (["+model.ffn.tau=0.5"], "model.ffn.tau is not a field of model.ffn (model/ffn=relu)"),
        (["model.d_modle=3"], "did you mean model.d_model?"),
        (["+zzz=1"], "zzz is not a field of the config"),
        (
            ["model/position=rope", "+model/position/rope_scaling=linear"],
            "model/position/rope_scaling=linear names no option of a config group; a built-in rope_scaling is set "
            "as model.position.rope_scaling.rope_type=linear",
        ),
        (["model/attention=gqa", "model.attention.kv_lora_rank=16"], "it is a field of model/attention=mla"),
        (["--cfg", "job", "+data.vocab_sise=8"], "did you mean data.vocab_size?"),  # nothing printed either
    ],
)
def test_an_unknown_override_names_the_key_and_the_nearest_fields(argv, words):
    assert words in _refused(argv)


def test_both_unknown_keys_are_named_in_one_line():
    message = _refused(["+train.max_updatez=5", "model.d_modle=3"])
    assert "train.max_updatez" in message and "model.d_modle" in message and "\n" not in message


def test_known_keys_and_every_experiment_and_ladder_step_pass():
    check_command_line(["model=transformer_tiny", "model/position=rope", "train.max_updates=3"], CONFIGS, "train")
    for group in ("experiment", "ladder"):
        for option in sorted((CONFIGS / group).glob("*.yaml")):
            check_command_line([f"{group}={option.stem}"], CONFIGS, "train")


def test_a_plugins_field_and_a_key_of_a_plugins_yaml(tmp_path):
    assert "did you mean model.attention.lambda_init?" in _refused(
        command_line_plugins([f"plugins=[{DIFF}]", "model/attention=diff", "model.attention.lamda_init=0.5"])
    )
    assert "it is a field of model/attention=diff" in _refused(
        command_line_plugins([f"plugins=[{DIFF}]", "model.attention.lambda_init=0.5"])
    )
    plugin = tmp_path / "typo_steps"
    (plugin / "configs" / "ladder").mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    (plugin / "configs" / "ladder" / "step5_typo.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /ladder/step5_gqa\nmodel:\n  attention:\n    n_kv_head: 2\n"
    )
    message = _refused(command_line_plugins([f"plugins=[{plugin}]", "experiment=ladder", "ladder=step5_typo"]))
    assert "model.attention.n_kv_head (in ladder/step5_typo) is not a field of model.attention" in message
    assert "did you mean model.attention.n_kv_heads?" in message


def test_a_multirun_is_refused_when_any_of_its_jobs_would_be():
    assert "it is a field of model/attention=mla" in _refused(
        ["-m", "model/attention=mla,gqa", "model.attention.kv_lora_rank=16", "seed=1,2"]
    )
    assert "model.ffn.tau" in _refused(["--multirun", "model.ffn.tau=0.5,1", "seed=1,2"])


def _positions() -> str:
    """The ``model/position`` options Hydra lists: the built-in ones and those an example plugin that an
    earlier test of this process imported registered (``examples/plugins/relbias``)."""
    plugins = {name for switch, name in ORIGINS if switch == "model/position"}
    return f"(options: {', '.join(sorted({'alibi', 'learned', 'none', 'rope', 'sinusoidal'} | plugins))})"


@pytest.mark.parametrize(
    "argv,line",
    [
        (
            ["model/position=rotary"],
            "model/position=rotary is not an option of model/position; did you mean rope? {positions}",
        ),
        (["model=llama_styl"], "model=llama_styl is not an option of model; did you mean llama_style? (options: "),
        (["experiment=ladder", "+ladder=step9"], "ladder=step9 is not an option of ladder; did you mean "),
        (["model/position=absolute"], "model/position=absolute is not an option of model/position {positions}"),
    ],
)
def test_a_misspelt_option_names_the_group_its_options_and_the_nearest(argv, line):
    with pytest.raises(UnknownOption) as err:
        check_command_line(argv, CONFIGS, "train")
    assert str(err.value).startswith(line.format(positions=_positions()))


def test_a_misspelt_option_of_a_multirun_or_a_plugin_is_refused_before_any_job(capsys, monkeypatch):
    """Every value of a sweep is an option; a plugin's options (stored, or its YAML files) are options;
    ``scripts/train.py``'s check prints the one line and exits 2, before Hydra makes a folder."""
    monkeypatch.setenv(SWEPT_KEYS_ENV, "")  # set by prepare_command_line for a multirun: restored after
    with pytest.raises(SystemExit) as exit_:
        prepare_command_line(["-m", "model/position=rope,alibii", "seed=1,2"], CONFIGS)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: model/position=alibii is not an option of model/position; did you mean alibi? {_positions()}"
    ]
    plugin = [f"plugins=[{DIFF}]"]
    check_command_line(command_line_plugins([*plugin, "model/attention=diff"]), CONFIGS, "train")
    with pytest.raises(
        UnknownOption,
        match=r"model/attention=dif is not an option of model/attention; did you mean diff\? \(options: diff, gqa, mha, mla, mqa\)",
    ):
        check_command_line(command_line_plugins([*plugin, "model/attention=dif"]), CONFIGS, "train")
    with pytest.raises(UnknownOption, match="ladder=step5_dif is not an option of ladder; did you mean step5_diff"):
        check_command_line(
            command_line_plugins(["-m", *plugin, "experiment=branches", "ladder=step5_gqa,step5_dif"]), CONFIGS, "train"
        )


def test_the_job_refuses_an_appended_key_itself():
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["+train.max_updatez=5"])
    assert unknown_fields(cfg) == [
        "train.max_updatez is not a field of train; did you mean train.max_updates or train.max_time?"
    ]
    with pytest.raises(ConfigError, match="train.max_updatez"):
        validate_config(cfg)


def test_train_refuses_an_unknown_key_in_one_line_with_status_2_and_no_folder(small_corpus, tmp_path):  # noqa: F811
    for mode, extra in (("run", []), ("multirun", ["-m", "seed=1,2"])):
        out = subprocess.run(
            [
                sys.executable,
                str(REPO_ROOT / "scripts" / "train.py"),
                *extra,
                *[
                    a
                    for a in small_cli_args(small_corpus, tmp_path, "train.max_updates=1")
                    if not a.startswith("run_dir=")
                ],
                "+train.max_updatez=5",  # Hydra's default folders (outputs/, multirun/) under tmp_path if accepted
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 2, (mode, out.stderr[-2000:])
        assert out.stderr.strip().splitlines() == [
            "error: invalid configuration: train.max_updatez is not a field of train; "
            "did you mean train.max_updates or train.max_time?"
        ], mode
        assert sorted(p.name for p in tmp_path.iterdir()) == [], mode  # no run, sweep or outputs/ folder
