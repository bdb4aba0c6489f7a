"""The module-check kit (transformer/testing/) over every built-in option of every group and both
plugin examples: one set of checks for ours and the users' options; and the kit catches what it
claims to (a deliberately broken attention fails the check it breaks)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from torch import nn

from tests.conftest import REPO_ROOT
from transformer.modules.attention import ATTENTION_KINDS, Attention
from transformer.modules.ffn import FFNS
from transformer.modules.moe import GroupedExperts
from transformer.modules.moe_router import ROUTER_SCORES
from transformer.modules.norms import NORMS
from transformer.modules.positions import POSITIONS
from transformer.modules.residual import RESIDUALS
from transformer.modules.rope_scaling import ROPE_SCALINGS
from transformer.plugins import ORIGINS
from transformer.testing import CHECKS, check_model, check_option, main, tiny_model

EXAMPLES = REPO_ROOT / "examples" / "plugins"
ROPE = {"model/position": "rope"}
MOE = {"ffn.n_experts": 4, "ffn.top_k": 2}
SCALING = {"position.rope_scaling.factor": 2.0, "position.rope_scaling.original_max_position_embeddings": 16}

# one case per built-in option of every group: (id, options, fields); the table test below holds it complete
CASES = [
    *[
        (
            f"attention={n}",
            {"model/attention": n, **(ROPE if n == "mla" else {})},
            {"attention.n_kv_heads": 2} if n == "gqa" else {},
        )
        for n in ("mha", "gqa", "mqa", "mla")
    ],
    *[(f"ffn={n}", {"model/ffn": n}, MOE if n == "moe" else {}) for n in ("relu", "gelu", "swiglu", "geglu", "moe")],
    *[(f"norm={n}", {"model/norm": n}, {}) for n in ("layernorm", "rmsnorm")],
    *[(f"position={n}", {"model/position": n}, {}) for n in ("sinusoidal", "learned", "rope", "alibi", "none")],
    *[
        (f"rope_scaling={n}", ROPE, {"position.rope_scaling.rope_type": n, **(SCALING if n != "default" else {})})
        for n in ("default", "linear", "ntk", "dynamic", "yarn", "llama3")
    ],
    *[(f"norm_position={n}", {}, {"norm_position": n}) for n in ("post", "pre")],
    *[(f"router={n}", {"model/ffn": "moe"}, {**MOE, "ffn.router": n}) for n in ("softmax", "sigmoid")],
    *[(f"qk_norm={n}", {}, {"qk_norm": n}) for n in ("layernorm", "rmsnorm")],
    ("window", ROPE, {"attention_window": 3, "attention_window_pattern": 2}),
]


def test_the_cases_cover_every_option_of_every_table():
    covered = {case_id for case_id, _, _ in CASES}
    tables = {
        "attention": ATTENTION_KINDS,
        "ffn": FFNS,
        "norm": NORMS,
        "position": POSITIONS,
        "rope_scaling": ROPE_SCALINGS,
        "norm_position": RESIDUALS,
        "router": ROUTER_SCORES,
    }
    plugin_options = {option for _, option in ORIGINS}  # the example plugins' (tests/conftest.py)
    builtin = {f"{group}={name}" for group, table in tables.items() for name in table if name not in plugin_options}
    builtin |= {f"qk_norm={name}" for name in NORMS if name not in plugin_options}
    assert builtin - covered == set(), "options of the zoo's tables the kit does not run over"


@pytest.mark.parametrize("case_id,options,fields", CASES, ids=[c[0] for c in CASES])
def test_every_builtin_option_passes_the_kit(case_id, options, fields):
    check_option(options=options, checks=WITHOUT_COMPILE, **fields)  # compiling: COMPILE_COMBINATIONS below


@pytest.mark.parametrize(
    "plugin,switch,option", [("diff_attention", "model/attention", "diff"), ("reglu", "model/ffn", "reglu")]
)
def test_the_plugin_examples_pass_the_kit(plugin, switch, option):
    check_option(switch, option, plugins=[EXAMPLES / plugin], checks=WITHOUT_COMPILE)


ONE_LAYER_ARGS = ("model.n_encoder_layers=1", "model.n_decoder_layers=1")  # every check, compiling too: small


def _without_compiling(monkeypatch) -> None:
    """The command line's plumbing without its slowest check: the plugin examples' compilation is
    checked on its own below (``test_the_plugin_examples_compile_without_graph_breaks``)."""
    monkeypatch.setitem(CHECKS, "compiles", lambda model: None)


def test_the_command_line_runs_the_kit_on_a_plugin(capsys, monkeypatch):
    _without_compiling(monkeypatch)
    argv = [f"plugins=[{EXAMPLES / 'diff_attention'}]", "model/attention=diff", "model.attention.lambda_init=0.5"]
    assert main([*argv, *ONE_LAYER_ARGS]) == 0
    assert capsys.readouterr().out.count("passed (model/attention=diff)") == 2
    assert main([f"plugins=[{EXAMPLES / 'reglu'}]", *ONE_LAYER_ARGS]) == 0  # its options
    assert capsys.readouterr().out.count("passed (model/ffn=reglu)") == 2


def test_the_command_line_refuses_in_one_line(capsys):
    assert main(["model/attention"]) == 2  # not <group>=<option>
    assert main([]) == 2 and "name the option to check" in capsys.readouterr().err  # nothing to check
    assert main(["model/ffn=swiglu", "model.d_ff=abc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "d_ff" in err
    assert (
        main([f"plugins=[{EXAMPLES / 'diff_attention'}]", "model/attention=diff", "model.attention.lambda_init=1.5"])
        == 2
    )
    assert capsys.readouterr().err == (
        "error: model/attention=diff: model.attention.lambda_init=1.5 must be in [0, 1) "
        "(the paper's schedule gives 0.2 to 0.8)\n"
    )  # the plugin's own validate()


class _PeekingAttention(Attention):
    """A broken attention: it ignores the causal mask, so every position sees the future."""

    def forward(self, x, memory=None, attn_mask=None, is_causal=False, rotary=None, cache=None):
        if memory is None and cache is None:
            attn_mask, is_causal = None, False
        return super().forward(x, memory, attn_mask, is_causal, rotary, cache)


def _with_peeking_self_attention(model: nn.Module) -> nn.Module:
    for layer in model.decoder.layers:
        attn = layer.self_attn.sublayer
        peeking = _PeekingAttention(
            n_heads=attn.n_heads,
            n_kv_heads=attn.n_kv_heads,
            head_dim=attn.head_dim,
            in_proj=attn.in_proj,
            out_proj=attn.out_proj,
        )
        layer.self_attn.sublayer = peeking
    return model


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_the_kit_catches_an_attention_that_sees_the_future(arch):
    model, _ = tiny_model(arch)
    check_model(model, ["causality"])  # the real one passes
    with pytest.raises(AssertionError, match=r"\[causality, .*the future leaks"):
        check_model(_with_peeking_self_attention(model), ["causality"])
    with pytest.raises(AssertionError, match="incremental_decoding"):
        check_model(model, ["incremental_decoding"])


def test_the_kit_catches_a_non_finite_gradient():
    model, _ = tiny_model()
    model.output_proj.weight.register_hook(lambda grad: grad * float("nan"))
    with pytest.raises(AssertionError, match="non-finite"):
        check_model(model, ["gradients"])


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize(
    "name,fields",
    [
        ("inverse_sqrt", {}),
        ("inverse_sqrt", {"form": "noam"}),
        ("cosine", {}),
        ("cosine", {"min_lr": 1e-5, "warmup_init_lr": 1e-7}),
        ("constant", {"warmup_updates": 0}),
    ],
)
def test_every_builtin_schedule_passes_the_kit(name, fields):
    check_option("lr_scheduler", name, **fields)


def test_the_command_line_checks_a_schedule(capsys):
    assert main(["lr_scheduler=cosine"]) == 0  # was an IndexError
    assert (
        capsys.readouterr().out == "lr_scheduler=cosine: finite rates >= 0, a rising warmup, a pure function: passed\n"
    )
    assert main(["lr_scheduler=cosine", "lr_scheduler.warmup_updates=50"]) == 2  # as training refuses it
    assert capsys.readouterr().err.startswith("error: lr_scheduler=cosine needs train.max_updates (40) > ")


def test_the_command_line_checks_every_option_a_plugin_registers_schedules_included(capsys, monkeypatch):
    out = subprocess.run(  # the kit as its own process: python -m transformer.testing
        [sys.executable, "-m", "transformer.testing", f"plugins=[{EXAMPLES / 'wsd_schedule'}]"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0 and out.stdout == (
        "lr_scheduler=wsd: finite rates >= 0, a rising warmup, a pure function: passed\n"
    ), out.stderr
    assert main([f"plugins=[{EXAMPLES / 'wsd_schedule'}]", "lr_scheduler=wsd", "lr_scheduler.decay_fraction=1.5"]) == 2
    assert capsys.readouterr().err == (
        "error: lr_scheduler=wsd: lr_scheduler.decay_fraction=1.5 must be in (0, 1]\n"
    )  # the plugin's own validate()
    _without_compiling(monkeypatch)
    assert main([f"plugins=[{EXAMPLES / 'scalenorm'}]", "model.norm.scale_init=2.0"]) == 0
    assert capsys.readouterr().out.count("passed (model/norm=scalenorm)") == 2


_CALLS = {"n": 0}


def _impure(update, cfg, base_lr, d_model, max_updates):
    _CALLS["n"] += 1  # a rate that depends on how often it was asked
    return base_lr * min(1.0, update / cfg.warmup_updates) * (1.0 + 1e-3 * (_CALLS["n"] % 3))


@pytest.mark.parametrize(
    "name,schedule,words",
    [
        ("kit_negative_sched", lambda u, cfg, lr, d, n: lr * (1 - 2 * u / n), "the rate of update 21 is -5.0"),
        ("kit_nan_sched", lambda u, cfg, lr, d, n: float("nan") if u == 7 else lr, "the rate of update 7 is nan"),
        (
            "kit_falling_sched",
            lambda u, cfg, lr, d, n: lr / u,
            "the warmup (lr_scheduler.warmup_updates=5) does not rise",
        ),
        ("kit_impure_sched", _impure, "is not a pure function of its arguments"),
    ],
)
def test_the_kit_catches_a_broken_schedule(name, schedule, words):
    from transformer.registry import register_lr_scheduler
    from transformer.testing import check_schedule

    if ("lr_scheduler", name) not in ORIGINS:
        register_lr_scheduler(name, schedule)
    with pytest.raises(AssertionError, match=re.escape(words)):
        check_schedule(name)


# check_compiles (torch.compile fullgraph of the training loss and of decode_step) over every built-in option: each
# option in one of these combinations of CASES (merged into one model, one layer a stack), each on one family; the
# per-option runs above leave it out (a compiled model takes seconds to trace, a combination covers several options)
COMPILE_COMBINATIONS = [
    ("encoder_decoder", ("attention=mha", "ffn=relu", "norm=layernorm", "position=sinusoidal", "norm_position=post")),
    (
        "decoder_only",
        ("attention=gqa", "ffn=gelu", "norm=rmsnorm", "position=learned", "norm_position=pre", "qk_norm=layernorm"),
    ),
    ("encoder_decoder", ("attention=mqa", "ffn=swiglu", "position=alibi", "qk_norm=rmsnorm")),
    ("decoder_only", ("attention=mla", "ffn=geglu", "rope_scaling=default")),
    ("encoder_decoder", ("ffn=moe", "router=softmax", "position=none")),
    ("decoder_only", ("router=sigmoid", "rope_scaling=linear", "window")),
    ("encoder_decoder", ("attention=gqa", "position=rope", "rope_scaling=ntk")),
    ("decoder_only", ("attention=mqa", "rope_scaling=dynamic")),
    ("encoder_decoder", ("attention=mla", "rope_scaling=yarn")),
    ("decoder_only", ("ffn=moe", "rope_scaling=llama3")),
]
ONE_LAYER = {"n_encoder_layers": 1, "n_decoder_layers": 1}
WITHOUT_COMPILE = [name for name in CHECKS if name != "compiles"]


def _merged(case_ids) -> tuple[dict, dict]:
    """The options and fields of several CASES as one model's (refusing two values of one switch)."""
    by_id = {case_id: (options, fields) for case_id, options, fields in CASES}
    options, fields = {}, dict(ONE_LAYER)
    for case_id in case_ids:
        for into, extra in zip((options, fields), by_id[case_id]):
            for key, value in extra.items():
                assert into.setdefault(key, value) == value, f"{case_id}: {key} set twice"
    return options, fields


def test_the_compile_combinations_cover_every_case():
    covered = [case_id for _, ids in COMPILE_COMBINATIONS for case_id in ids]
    assert sorted(set(covered)) == sorted(case_id for case_id, _, _ in CASES)
    for _, ids in COMPILE_COMBINATIONS:
        _merged(ids)  # no switch set twice


@pytest.mark.slow
@pytest.mark.parametrize("arch,case_ids", COMPILE_COMBINATIONS, ids=["+".join(ids) for _, ids in COMPILE_COMBINATIONS])
def test_every_builtin_option_compiles_without_graph_breaks(arch, case_ids):
    options, fields = _merged(case_ids)
    check_option(options=options, archs=[arch], checks=["compiles"], **fields)


@pytest.mark.parametrize(
    "plugin,switch,option,arch",
    [("diff_attention", "model/attention", "diff", "encoder_decoder"), ("reglu", "model/ffn", "reglu", "decoder_only")],
)
def test_the_plugin_examples_compile_without_graph_breaks(plugin, switch, option, arch):
    check_option(switch, option, plugins=[EXAMPLES / plugin], archs=[arch], checks=["compiles"], **ONE_LAYER)


def test_the_kit_catches_a_graph_break(monkeypatch):
    """The mixture of experts' eager loop over the experts (``tolist`` of the per-expert counts) cannot
    be traced; the kit names the function that fails."""
    model, _ = tiny_model("decoder_only", {"model/ffn": "moe"}, **MOE, **ONE_LAYER)
    monkeypatch.setattr(GroupedExperts, "path", lambda self, x: "loop")
    with pytest.raises(
        AssertionError,
        match=r"\[compiles, decoder_only\] the training loss \(model_loss\) does not "
        r"compile in one graph",
    ):
        check_model(model, ["compiles"])
