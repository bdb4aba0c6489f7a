"""Plugins (transformer/plugins.py, transformer/registry.py) as a user meets them: the package installed
(not editable) into a folder of its own, the plugin examples copied into the user's folder outside the
repository, then train, resume, sweep, translate, average, compare and export; a moved or changed
plugin is never imported without the trust switch; and the bad cases each end in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, multi30k_excerpt, parallel_text_args

EXAMPLES = REPO_ROOT / "examples" / "plugins"
OPTIONS = ["model/attention=diff", "model.attention.lambda_init=0.5", "model/ffn=reglu", "model/position=rope"]


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> dict:
    """The package installed with ``pip install --no-deps --target`` (a wheel build of a copy of the
    package, not the checkout), a tiny corpus, and the two examples in the user's own folder."""
    root = tmp_path_factory.mktemp("user")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    shutil.copytree(REPO_ROOT / "transformer", src / "transformer", ignore=shutil.ignore_patterns("__pycache__"))
    site = root / "site"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    corpus = multi30k_excerpt(root / "corpus", {"train": 300, "val": 20, "test_2016_flickr": 12})
    ideas = root / "my_ideas"
    for name in ("diff_attention", "reglu"):
        shutil.copytree(EXAMPLES / name, ideas / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    which = subprocess.run(
        [sys.executable, "-c", "import transformer; print(transformer.__file__)"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert which.stdout.strip() == str(site / "transformer" / "__init__.py"), which
    return {"root": root, "corpus": corpus, "ideas": ideas, "env": env}


def _run(user: dict, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / script), *args],
        cwd=user["root"],
        env=user["env"],
        capture_output=True,
        text=True,
        timeout=900,
    )


def _train_args(user: dict, run_dir: Path, *extra: str) -> list[str]:
    c = user["corpus"]
    return [
        f"plugins=[{user['ideas'] / 'diff_attention'},{user['ideas'] / 'reglu'}]",
        *OPTIONS,
        *parallel_text_args(c, 250),
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        "model.d_model=32",
        "model.n_heads=4",
        "model.d_ff=64",
        "train.max_tokens=500",
        "train.max_updates=4",
        "train.max_time=0",
        "train.validate_every=4",
        "train.valid_bleu=false",
        "train.save_every=2",
        "train.progress=false",
        "train.num_threads=1",
        "train.precision=fp32",
        "lr_scheduler.warmup_updates=2",
        "generation.beam_size=2",
        "generation.max_len_b=5",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def _one_error_line(out: subprocess.CompletedProcess, *words: str) -> str:
    # the line saying which weights a run folder resolves to (run_weights.find_checkpoint) may come first
    lines = [
        ln
        for ln in out.stderr.splitlines()
        if ln.strip() and not re.search(r": loading checkpoint_\w+\.safetensors", ln)
    ]
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def run(user) -> Path:
    run_dir = user["root"] / "run"
    out = _run(user, "train.py", *_train_args(user, run_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


def test_a_plugin_run_records_its_files_and_trains_and_resumes(user, run):
    cfg = (run / "config.yaml").read_text()
    assert "name: diff" in cfg and "lambda_init: 0.5" in cfg and "name: reglu" in cfg
    results = json.loads((run / "results.json").read_text())
    files = results["config"]["plugin_files"]
    assert set(files) >= {"diff_attention/__init__.py", "reglu/__init__.py", "reglu/configs/ladder/step5_reglu.yaml"}
    assert results["config"]["plugins"] == [str(user["ideas"] / "diff_attention"), str(user["ideas"] / "reglu")]
    assert (run / "plugins" / "diff_attention" / "__init__.py").read_bytes() == (
        user["ideas"] / "diff_attention" / "__init__.py"
    ).read_bytes()
    assert results["flops_per_token"] > 0 and results["params"] > 0  # the plugin gives its cost
    out = _run(user, "train.py", *_train_args(user, run, "train.max_updates=6", "train.resume=true"))
    assert out.returncode == 0 and "resumed from" in out.stderr, out.stderr[-3000:]
    assert json.loads((run / "results.json").read_text())["updates"] == 6


def test_a_plugin_step_composes_from_the_plugins_configs_folder(user):
    out = _run(
        user,
        "train.py",
        f"plugins=[{user['ideas'] / 'reglu'}]",
        "experiment=branches",
        "ladder=step5_reglu",
        "--cfg",
        "job",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "name: reglu" in out.stdout and "name: gqa" in out.stdout  # step5 + the plugin's FFN


def test_a_sweep_over_a_plugin_option_and_a_builtin_one(user):
    sweep = user["root"] / "sweep"
    args = [
        a
        for a in _train_args(user, sweep / "x")
        if not a.startswith(("hydra.run.dir", "model/attention", "model.attention"))
    ]
    out = _run(
        user,
        "train.py",
        "-m",
        *args,
        "model/attention=diff,gqa",
        "train.max_updates=2",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${hydra.job.num}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [
        json.loads((sweep / n / "results.json").read_text())["config"]["model"]["attention"]["name"] for n in ("0", "1")
    ] == ["diff", "gqa"]
    compared = _run(user, "compare.py", str(sweep), "--out", str(sweep / "cmp"), "--bootstrap", "0")
    assert compared.returncode == 0, compared.stderr[-3000:]
    table = (sweep / "cmp" / "comparison.md").read_text()
    assert "| diff (baseline)" in table and "| gqa" in table


@pytest.mark.slow
def test_translate_average_compare_and_export_a_plugin_run(user, run):
    src = user["root"] / "in.txt"
    src.write_text("A man rides a bike.\nTwo dogs play.\n", encoding="utf-8")
    out = _run(user, "translate.py", f"checkpoint={run}", f"input={src}", "progress=false")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 2, out.stderr[-2000:]
    avg = user["root"] / "avg" / "avg.safetensors"
    out = _run(
        user,
        "average_checkpoints.py",
        "--inputs",
        str(run / "checkpoint_2.safetensors"),
        str(run / "checkpoint_4.safetensors"),
        "--output",
        str(avg),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    out = _run(user, "translate.py", f"checkpoint={avg}", f"input={src}", "progress=false")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 2, out.stderr[-2000:]
    out = _run(user, "compare.py", str(run), "--out", str(user["root"] / "cmp"), "--bootstrap", "0")
    assert out.returncode == 0, out.stderr[-2000:]
    for fmt in ("hf", "ctranslate2"):
        out = _run(user, "export.py", f"run={run}", f"out={user['root'] / fmt}", f"format={fmt}")
        _one_error_line(
            out,
            "model/attention=diff: an option of the plugin diff_attention",
            "model/ffn=reglu: an option of the plugin reglu",
        )
        assert not (user["root"] / fmt).exists()


def test_a_moved_plugin_is_imported_only_when_trusted_or_named(user, run):
    src = user["root"] / "in.txt"
    src.write_text("A man rides a bike.\n", encoding="utf-8")
    moved = user["root"] / "moved"
    shutil.move(user["ideas"], moved)
    try:
        out = _run(user, "translate.py", f"checkpoint={run}", f"input={src}", "progress=false")
        line = _one_error_line(
            out, "was trained with the plugin", str(run / "plugins" / "diff_attention"), "plugins_trust=true"
        )
        assert "__init__.py" in line
        out = _run(user, "translate.py", f"checkpoint={run}", f"input={src}", "progress=false", "plugins_trust=true")
        assert out.returncode == 0 and len(out.stdout.splitlines()) == 1, out.stderr[-2000:]
        out = _run(
            user,
            "translate.py",
            f"checkpoint={run}",
            f"input={src}",
            "progress=false",
            f"plugins=[{moved / 'diff_attention'},{moved / 'reglu'}]",
        )
        assert out.returncode == 0, out.stderr[-2000:]
        (run / "plugins" / "reglu" / "__init__.py").write_text("raise SystemExit('not the recorded file')\n")
        out = _run(user, "translate.py", f"checkpoint={run}", f"input={src}", "progress=false", "plugins_trust=true")
        _one_error_line(out, "does not hold the files", "sha256")
    finally:
        shutil.copy(moved / "reglu" / "__init__.py", run / "plugins" / "reglu" / "__init__.py")
        shutil.move(moved, user["ideas"])


def test_a_changed_plugin_does_not_resume(user, run):
    init = user["ideas"] / "reglu" / "__init__.py"
    original = init.read_text()
    init.write_text(original + "\n# an edit after the run started\n")
    try:
        out = _run(user, "train.py", *_train_args(user, run, "train.max_updates=8", "train.resume=true"))
        _one_error_line(out, "plugin")
    finally:
        init.write_text(original)


@pytest.mark.parametrize(
    "body,words",
    [
        ("import torch\nraise RuntimeError('my bug')\n", ["failed to import", "__init__.py:2", "RuntimeError: my bug"]),
        ("def f(:\n", ["failed to import", "SyntaxError"]),
        (
            "from transformer.modules.ffn import GatedFeedForward\nfrom transformer.registry import register_ffn\n"
            "register_ffn('swiglu', GatedFeedForward)\n",
            ["model/ffn=swiglu is a built-in option already", "broken"],
        ),
    ],
)
def test_bad_plugins_end_in_one_line(user, body, words):
    bad = user["root"] / "bad" / "broken"
    bad.mkdir(parents=True, exist_ok=True)
    (bad / "__init__.py").write_text(body)
    out = _run(user, "train.py", f"plugins=[{bad}]", "--cfg", "job")
    _one_error_line(out, *words)


def test_a_missing_plugin_ends_in_one_line(user):
    _one_error_line(_run(user, "train.py", f"plugins=[{user['root'] / 'nowhere'}]", "--cfg", "job"), "does not exist")


def _plugin(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(body)
    return folder


def test_an_import_error_names_the_plugins_own_file_and_line(tmp_path):
    from transformer.plugins import PluginError, import_plugin

    bad = _plugin(tmp_path / "syntax_bad", "x = 1\ndef f(:\n")
    with pytest.raises(PluginError, match=rf"{bad / '__init__.py'}:2: SyntaxError: invalid syntax"):
        import_plugin(bad)
    clash = _plugin(
        tmp_path / "clash_bad",
        "from transformer.modules.ffn import GatedFeedForward\n"
        "from transformer.registry import register_ffn\n"
        "register_ffn('swiglu', GatedFeedForward)\n",
    )
    with pytest.raises(PluginError, match=rf"{clash / '__init__.py'}:3: ConfigError: model/ffn=swiglu is a built-in"):
        import_plugin(clash)  # the line that registered the name, not the registry's


def test_a_recorded_plugin_says_whether_it_changed_or_was_renamed(tmp_path):
    from transformer.plugins import PluginError, import_recorded, plugin_files, set_user_choice

    original = _plugin(tmp_path / "mine" / "squared_relu", "# registers nothing\n")
    config = {
        "plugins": [str(original)],
        "plugin_files": {f"squared_relu/{k}": v for k, v in plugin_files(original).items()},
    }
    run = tmp_path / "run"
    shutil.copytree(original, run / "plugins" / "squared_relu")
    renamed = tmp_path / "moved" / "primer"
    shutil.copytree(original, renamed)
    (original / "__init__.py").write_text("# edited after the run\n")
    try:
        with pytest.raises(
            PluginError, match=rf"has changed since the run \(__init__.py differs in {original}\); .*plugins_trust=true"
        ):
            import_recorded(run, config)
        set_user_choice([str(renamed)])
        with pytest.raises(
            PluginError,
            match=rf"{renamed} holds the files of the plugin squared_relu .* name the "
            "folder squared_relu",
        ):
            import_recorded(run, config)
        shutil.rmtree(original)
        set_user_choice([])
        with pytest.raises(PluginError, match="squared_relu, which is not there any more; "):
            import_recorded(run, config)
        edited = _plugin(tmp_path / "elsewhere" / "squared_relu", "# moved, then edited\n")
        set_user_choice([str(edited)])  # the folder the user names: where the command looked, which file differs
        with pytest.raises(
            PluginError,
            match=rf"which is not there any more; the folder you named, {edited}, holds other files "
            rf"\(__init__.py differs in {edited}\); the run recorded its files in",
        ):
            import_recorded(run, config)
    finally:
        set_user_choice([])


# ---------------------------------------------------------------- an option's own fields: checks, errors, export

PROBE_NORM = '''"""A norm that says what its constructor received (the contract of transformer.registry)."""
import sys
from dataclasses import dataclass

from torch import nn

from transformer.config import NormConfig
from transformer.registry import register_norm


@dataclass
class ProbeNormConfig(NormConfig):
    name: str = "probe_norm"
    tag: str = "unset"


@register_norm("probe_norm", config=ProbeNormConfig)
class ProbeNorm(nn.LayerNorm):
    @classmethod
    def from_sizes(cls, *, width, eps, config):
        print(f"probe_norm built: width={width} tag={config.tag}", file=sys.stderr)
        return cls(width, eps=eps)
'''

BROKEN_SCHEDULE = """from transformer.registry import register_lr_scheduler


@register_lr_scheduler("broken_sched")
def broken(update, cfg, base_lr, d_model, max_updates):
    raise RuntimeError("my schedule bug")
"""


def _other_plugins(user: dict) -> Path:
    """The issue-43 plugins in the user's folder: the WSD and ScaleNorm examples, a probe norm and a
    schedule that fails when called."""
    more = user["root"] / "more_ideas"
    if not more.exists():
        for name in ("wsd_schedule", "scalenorm"):
            shutil.copytree(EXAMPLES / name, more / name, ignore=shutil.ignore_patterns("__pycache__"))
        _plugin(more / "probe_norm", PROBE_NORM)
        _plugin(more / "broken_sched", BROKEN_SCHEDULE)
    return more


def _plain_args(user: dict, run_dir: Path, plugins: list[Path], *extra: str) -> list[str]:
    """:func:`_train_args` without the two examples' options, with ``plugins`` instead."""
    args = [a for a in _train_args(user, run_dir) if not a.startswith("plugins=") and a not in OPTIONS]
    return [f"plugins=[{','.join(str(p) for p in plugins)}]", *args, *extra]


def test_a_plugin_norms_field_reaches_its_constructor_in_training_resume_and_translate(user):
    more = _other_plugins(user)
    run_dir = user["root"] / "probe_run"
    args = _plain_args(
        user,
        run_dir,
        [more / "probe_norm"],
        "model/norm=probe_norm",
        "model.norm.tag=hello",
        "model.qk_norm=probe_norm",
        "model.norm_position=pre",
    )
    out = _run(user, "train.py", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "probe_norm built: width=32 tag=hello" in out.stderr  # model.norm, over d_model
    assert "probe_norm built: width=8 tag=hello" in out.stderr  # model.qk_norm, over head_dim, the same node
    assert "tag: hello" in (run_dir / "config.yaml").read_text()
    out = _run(user, "train.py", *args[:-3], "train.max_updates=6", "train.resume=true")  # the field from the run
    assert out.returncode == 0 and "resumed from" in out.stderr, out.stderr[-3000:]
    assert "probe_norm built: width=32 tag=hello" in out.stderr
    src = user["root"] / "probe.txt"
    src.write_text("A man rides a bike.\n", encoding="utf-8")
    out = _run(user, "translate.py", f"checkpoint={run_dir}", f"input={src}", "progress=false")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 1, out.stderr[-2000:]
    assert "probe_norm built: width=32 tag=hello" in out.stderr


@pytest.mark.parametrize(
    "extra,words",
    [
        (
            ["lr_scheduler=wsd", "lr_scheduler.decay_fraction=1.5"],
            ["lr_scheduler=wsd: lr_scheduler.decay_fraction=1.5 must be in (0, 1]"],
        ),  # validate(self)
        (
            ["lr_scheduler=wsd", "lr_scheduler.decay_fraction=0.9"],  # validate_config(self, cfg): warmup 2 + 4 > 4
            ["lr_scheduler=wsd: lr_scheduler.warmup_updates=2 plus the decay's 4 updates", "train.max_updates=4"],
        ),
        (["model/norm=scalenorm", "model.norm.scale_init=-1"], ["model/norm=scalenorm: model.norm.scale_init=-1"]),
        (
            ["lr_scheduler=broken_sched"],  # the plugin's own code fails when the run is built
            ["the plugin broken_sched failed at", "broken_sched/__init__.py:6", "RuntimeError: my schedule bug"],
        ),
    ],
)
def test_a_plugin_option_refused_or_failing_ends_in_one_line_and_leaves_no_folder(user, extra, words):
    more = _other_plugins(user)
    run_dir = user["root"] / "refused_run"
    plugins = [more / "wsd_schedule", more / "scalenorm", more / "broken_sched"]
    out = _run(user, "train.py", *_plain_args(user, run_dir, plugins, *extra))
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and [ln for ln in lines if ln.startswith("error: ")] == lines[-1:], out.stderr[-3000:]
    assert all(w in lines[-1] for w in words), lines[-1]  # after the data's log line when the run was being built
    assert len(lines) == 1 or extra == ["lr_scheduler=broken_sched"], out.stderr[-3000:]  # refused before any work
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


@pytest.mark.slow
def test_a_run_with_a_plugin_schedule_exports_and_imports_back(user):
    pytest.importorskip("transformers")
    more = _other_plugins(user)
    run_dir = user["root"] / "wsd_run"
    out = _run(
        user,
        "train.py",
        *_plain_args(
            user,
            run_dir,
            [more / "wsd_schedule"],
            "model=llama_style",
            "data.joint_vocab=true",
            "lr_scheduler=wsd",
            "lr_scheduler.decay_fraction=0.5",
            "lr_scheduler.warmup_updates=1",
        ),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    hf = user["root"] / "wsd_hf"
    out = _run(user, "export.py", f"run={run_dir}", f"out={hf}", "format=hf")
    assert out.returncode == 0, out.stderr[-3000:]
    # without the plugin: its schedule is dropped with a note, the imported run has the default one
    back = user["root"] / "wsd_back"
    out = _run(user, "export.py", f"run={hf}", f"out={back}", "format=zoo")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "note: lr_scheduler=wsd is an option of a plugin not imported here" in out.stderr
    saved = (back / "config.yaml").read_text()
    assert "decay_fraction" not in saved and "name: inverse_sqrt" in saved and "wsd_schedule" not in saved
    # with it: the fields kept and read, the plugin recorded from where it was named
    kept = user["root"] / "wsd_back_kept"
    out = _run(user, "export.py", f"run={hf}", f"out={kept}", "format=zoo", f"plugins=[{more / 'wsd_schedule'}]")
    assert out.returncode == 0 and "note:" not in out.stderr, out.stderr[-3000:]
    saved = (kept / "config.yaml").read_text()
    assert "name: wsd" in saved and "decay_fraction: 0.5" in saved and str(more / "wsd_schedule") in saved
    src = user["root"] / "wsd.txt"
    src.write_text("A man rides a bike.\n", encoding="utf-8")
    for folder in (back, kept):
        out = _run(user, "translate.py", f"checkpoint={folder}", f"input={src}", "progress=false")
        assert out.returncode == 0 and len(out.stdout.splitlines()) == 1, out.stderr[-2000:]
    # a run config beside the model that does not fit the schema: one line, exit status 2
    (hf / "transformer_zoo.yaml").write_text("lr_scheduler:\n  warmup_updates: many\n")
    _one_error_line(
        _run(user, "export.py", f"run={hf}", f"out={user['root'] / 'bad_back'}", "format=zoo"),
        str(hf / "transformer_zoo.yaml"),
        "'many'",
    )


def test_validate_and_validate_config_run_for_a_schedule_and_name_it():
    from transformer.config import ConfigError, typed_config, validate_config
    from transformer.plugins import import_plugins

    import_plugins([EXAMPLES / "wsd_schedule"])
    cfg = typed_config(
        {"lr_scheduler": {"name": "wsd", "decay_fraction": 0.25, "warmup_updates": 10}, "train": {"max_updates": 100}}
    )
    validate_config(cfg)  # fits: 10 + 25 <= 100
    cfg.lr_scheduler.decay_fraction = 1.5
    with pytest.raises(ConfigError, match=r"^lr_scheduler=wsd: lr_scheduler.decay_fraction=1.5 must be in \(0, 1\]$"):
        validate_config(cfg)
    cfg.lr_scheduler.decay_fraction = 0.25
    cfg.train.max_updates = 0
    cfg.train.max_time = 60
    with pytest.raises(ConfigError, match=r"^lr_scheduler=wsd: needs train.max_updates > 0"):
        validate_config(cfg)


def test_a_norms_from_sizes_gets_the_norm_node_and_qk_norm_the_same_or_the_defaults():
    from transformer.plugins import import_plugins
    from transformer.testing import tiny_model

    import_plugins([EXAMPLES / "scalenorm"])
    model, _ = tiny_model(
        "decoder_only", {"model/norm": "scalenorm"}, **{"norm.scale_init": 3.0, "qk_norm": "scalenorm"}
    )
    scales = {name: float(p.detach()) for name, p in model.named_parameters() if name.endswith(".scale")}
    assert scales and all(v == 3.0 for v in scales.values())  # the stacks' norms and the QK-norms: the node's field
    assert any("q_norm" in name for name in scales)
    model, _ = tiny_model("decoder_only", {"model/norm": "rmsnorm"}, qk_norm="scalenorm")
    scales = {name: float(p.detach()) for name, p in model.named_parameters() if name.endswith(".scale")}
    assert scales and all(v == pytest.approx(8**0.5) for v in scales.values())  # the option's default: sqrt(head_dim)


# ---------------------------------------------------------------- RoPE scalings' fields, failures at run time

PROBE_ROPE = '''"""A RoPE scaling with a field of its own that says what its from_sizes received (transformer.registry)."""
import sys
from dataclasses import dataclass

from transformer.config import RopeScalingConfig
from transformer.modules.rope_scaling import unscaled_inv_freq
from transformer.registry import register_rope_scaling


@dataclass
class ProbeRopeConfig(RopeScalingConfig):
    rope_type: str = "probe_rope"
    stretch: float = 2.0

    def validate(self):
        if not self.stretch >= 1.0:
            raise ValueError(f"model.position.rope_scaling.stretch={self.stretch} must be >= 1")


@register_rope_scaling("probe_rope", config=ProbeRopeConfig)
class ProbeRope:
    @classmethod
    def from_sizes(cls, *, head_dim, theta, scaling, config):
        print(f"probe_rope built: head_dim={head_dim} stretch={config.stretch}", file=sys.stderr)
        return unscaled_inv_freq(head_dim, theta) / config.stretch, 1.0
'''

FAILING_NORM = '''"""A norm whose code raises where FAILING_NORM says: build (its from_sizes) or forward."""
import os

from torch import nn

from transformer.registry import register_norm


@register_norm("failing_norm")
class FailingNorm(nn.LayerNorm):
    @classmethod
    def from_sizes(cls, *, width, eps):
        if os.environ.get("FAILING_NORM") == "build":
            raise RuntimeError("my norm's constructor bug")
        return cls(width, eps=eps)

    def forward(self, x):
        if os.environ.get("FAILING_NORM") == "forward":
            raise RuntimeError("my norm's forward bug")
        return super().forward(x)
'''


@pytest.mark.slow
def test_a_plugin_rope_scalings_field_reaches_its_from_sizes_in_training_resume_and_translate(user):
    """Chosen with ``+model/position/rope_scaling=<name>`` (the group has no entry in the defaults list)."""
    probe = user["root"] / "rope_ideas" / "probe_rope"
    if not probe.exists():
        _plugin(probe, PROBE_ROPE)
    run_dir = user["root"] / "probe_rope_run"
    args = _plain_args(
        user,
        run_dir,
        [probe],
        "model/position=rope",
        "+model/position/rope_scaling=probe_rope",
        "model.position.rope_scaling.stretch=3",
    )
    out = _run(user, "train.py", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "probe_rope built: head_dim=8 stretch=3.0" in out.stderr  # d_model 32 / 4 heads
    assert "rope_type: probe_rope" in (run_dir / "config.yaml").read_text()
    assert "stretch: 3.0" in (run_dir / "config.yaml").read_text()
    # the field is fixed on resume: the run's value is built, another one refused in one line
    out = _run(user, "train.py", *args[:-1], "train.max_updates=6", "train.resume=true")
    assert out.returncode == 0 and "probe_rope built: head_dim=8 stretch=3.0" in out.stderr, out.stderr[-3000:]
    _one_error_line(
        _run(user, "train.py", *args[:-1], "model.position.rope_scaling.stretch=4", "train.resume=true"),
        "model.position.rope_scaling.stretch",
    )
    src = user["root"] / "probe_rope.txt"
    src.write_text("A man rides a bike.\n", encoding="utf-8")
    out = _run(user, "translate.py", f"checkpoint={run_dir}", f"input={src}", "progress=false")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 1, out.stderr[-2000:]
    assert "probe_rope built: head_dim=8 stretch=3.0" in out.stderr
    # at test time its own field is appended with "+" (translate.yaml's node holds the built-in fields)
    out = _run(
        user,
        "translate.py",
        f"checkpoint={run_dir}",
        f"input={src}",
        "progress=false",
        "+model.position.rope_scaling.stretch=4",
    )
    assert out.returncode == 0 and "probe_rope built: head_dim=8 stretch=4.0" in out.stderr, out.stderr[-2000:]
    # an invalid value: one line naming the option and the field, no run folder
    refused = user["root"] / "probe_rope_refused"
    out = _run(
        user,
        "train.py",
        *_plain_args(
            user,
            refused,
            [probe],
            "model/position=rope",
            "+model/position/rope_scaling=probe_rope",
            "model.position.rope_scaling.stretch=0.5",
        ),
    )
    _one_error_line(out, "model/position/rope_scaling=probe_rope: model.position.rope_scaling.stretch=0.5 must be >= 1")
    assert not refused.exists()


def test_a_rope_scaling_is_a_function_or_a_class_whose_from_sizes_gets_the_node(monkeypatch):
    import torch

    from transformer.config import ConfigError
    from transformer.modules.rope_scaling import ROPE_SCALINGS, RopeScaling, rope_inv_freq, unscaled_inv_freq
    from transformer.registry import register_rope_scaling

    seen = {}

    class Halved:
        @classmethod
        def from_sizes(cls, *, head_dim, theta, scaling, config):
            seen.update(head_dim=head_dim, theta=theta, config=config)
            return unscaled_inv_freq(head_dim, theta) / config["stretch"], 2.0

    monkeypatch.setitem(ROPE_SCALINGS, "t43_halved", Halved)
    monkeypatch.setitem(
        ROPE_SCALINGS, "t43_plain", lambda head_dim, theta, s: (unscaled_inv_freq(head_dim, theta) / 4, 1.0)
    )
    inv_freq, factor = rope_inv_freq(8, 10000.0, RopeScaling(rope_type="t43_halved", config={"stretch": 2.0}))
    assert torch.allclose(inv_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]) / 2) and factor == 2.0
    assert seen == {"head_dim": 8, "theta": 10000.0, "config": {"stretch": 2.0}}
    inv_freq, factor = rope_inv_freq(8, 10000.0, RopeScaling(rope_type="t43_plain"))
    assert torch.allclose(inv_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]) / 4) and factor == 1.0
    assert RopeScaling(rope_type="linear", config={"a": 1}) == RopeScaling(rope_type="linear")  # not compared
    with pytest.raises(ConfigError, match=r"model/position/rope_scaling=t43_fields: .* needs a classmethod from_sizes"):
        register_rope_scaling("t43_fields", lambda head_dim, theta, s: None, config=object)
    assert "t43_fields" not in ROPE_SCALINGS


@pytest.mark.slow
def test_a_plugins_code_failing_in_translate_evaluate_and_export_ends_in_one_line(user):
    failing = user["root"] / "failing_ideas" / "failing_norm"
    if not failing.exists():
        _plugin(failing, FAILING_NORM)
    run_dir = user["root"] / "failing_norm_run"
    out = _run(user, "train.py", *_plain_args(user, run_dir, [failing], "model/norm=failing_norm"))
    assert out.returncode == 0, out.stderr[-3000:]
    src = user["root"] / "failing.txt"
    src.write_text("A man rides a bike.\n", encoding="utf-8")
    where = str(failing / "__init__.py")

    def fails(stage: str, script: str, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, str(REPO_ROOT / "scripts" / script), *args],
            cwd=user["root"],
            env={**user["env"], "FAILING_NORM": stage},
            capture_output=True,
            text=True,
            timeout=900,
        )
        errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
        assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
        assert errors[0].startswith(f"error: the plugin failing_norm failed at {where}:"), errors[0]
        return errors[0]

    forward = "RuntimeError: my norm's forward bug"
    assert fails("forward", "translate.py", f"checkpoint={run_dir}", f"input={src}", "progress=false").endswith(
        f"{where}:19: {forward}"
    )  # not a line left empty: the plugin's bug
    assert fails("forward", "evaluate.py", f"checkpoint={run_dir}", "progress=false").endswith(f":19: {forward}")
    assert not (run_dir / "eval").exists()  # no score of a model that never ran
    built = "RuntimeError: my norm's constructor bug"
    assert fails("build", "translate.py", f"checkpoint={run_dir}", f"input={src}").endswith(f":14: {built}")
    assert fails("build", "export.py", f"run={run_dir}", f"out={user['root'] / 'failing_hf'}", "format=hf").endswith(
        f":14: {built}"
    )
    assert not (user["root"] / "failing_hf").exists()


def test_a_plugin_failing_at_the_first_update_leaves_no_folder(tmp_path):
    failing = _plugin(tmp_path / "ideas" / "failing_norm", FAILING_NORM)
    corpus = multi30k_excerpt(tmp_path / "corpus", {"train": 200, "val": 8, "test_2016_flickr": 4})
    work = tmp_path / "work"  # the working directory: Hydra's default outputs/default/<date>/ goes under it
    work.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "train.py"),
            f"plugins=[{failing}]",
            "model/norm=failing_norm",
            *parallel_text_args(corpus, 200),
            "model=transformer_tiny",
            "train.max_updates=2",
            "train.max_time=0",
            "train.progress=false",
            "train.num_threads=1",
        ],
        cwd=work,
        env={**os.environ, "FAILING_NORM": "forward"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert out.returncode == 2 and len(errors) == 1 and "my norm's forward bug" in errors[0], out.stderr[-3000:]
    assert sorted(p.name for p in work.iterdir()) == []  # no run folder, no outputs/default/
