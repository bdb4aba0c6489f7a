"""The GPU check on the CPU: ``python -m benchmarks.gpu_check --device cpu --quick`` end to end (its
``realistic`` and ``trainer`` sections included), its report's pieces, its time budget, and the shell
scripts around it (``scripts/gpu_check.sh``, ``scripts/results_gpu.sh``) on a slice of Multi30k.

No GPU runs here: the CPU smoke mode exercises every section's code (the trainer, the decoder, the
SDPA profile) with the CPU standing in for the device, so decoding parity
and the first-step loss are trivially equal; the GPU results come from ``scripts/gpu_check.sh`` on
a GPU machine.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT, SHARED_DATA, multi30k_excerpt, parallel_text_args

COMMAND = [sys.executable, "-m", "benchmarks.gpu_check"]  # run from the repository root
HAVE_DATA = (SHARED_DATA / "multi30k" / "train.en.gz").is_file()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"real Multi30k data not found under {SHARED_DATA}")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TRANSFORMER_DATA_DIR": str(SHARED_DATA), "OMP_NUM_THREADS": "1", **extra}


def load_gpu_check():
    """The names the tests use: the check's command line and report, and the GPUs' peak table."""
    import types

    from benchmarks.gpu_check import cli, report
    from benchmarks.train_step import device_peak

    return types.SimpleNamespace(**{**vars(report), **vars(cli)}, device_peak=device_peak)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One CPU smoke run of every section but training_compile (compiling takes minutes on 2 cores);
    the trainer section's eager, compiled (dynamo's eager backend) and 1-rank DDP rows at tiny sizes;
    the realistic section at tiny sizes with the base and Llama-style models (big is base's code with
    other sizes), eager and compiled (dynamo with the eager backend; CUDA graphs are left out on a CPU)."""
    if not HAVE_DATA:
        pytest.skip(f"real Multi30k data not found under {SHARED_DATA}")
    tmp = tmp_path_factory.mktemp("gpu_check")
    out = tmp / "out"
    proc = subprocess.run(
        [
            *COMMAND,
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
            "--work",
            str(tmp / "work"),
            "--skip",
            "training_compile",
            "--realistic-models",
            "base",
            "llama100m",
            "--realistic-modes",
            "eager",
            "compiled",
            "cudagraphs",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=900,
        cwd=REPO_ROOT,
    )
    assert (out / "gpu_check.json").is_file(), proc.stderr[-3000:]
    return proc, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_every_section_is_recorded_with_a_status(quick_run):
    proc, data, md = quick_run
    gc = load_gpu_check()
    sections = data["sections"]
    assert set(sections) == set(gc.SECTIONS)
    # the trainer's own update and the compiled trainer first, then the realistic rows
    assert gc.SECTIONS[:4] == ("environment", "trainer", "training_compile", "realistic")
    assert list(sections) == list(gc.SECTIONS)  # recorded in the order they ran
    for name, sec in sections.items():
        assert sec["status"] in ("passed", "failed", "skipped"), (name, sec["status"])
        if sec["status"] == "failed":
            assert sec.get("error"), name
        if sec["status"] == "skipped":
            assert sec.get("reason"), name
        assert f"| {name} | {sec['status']} |" in md
    assert sections["training_compile"] == {**sections["training_compile"], "status": "skipped", "reason": "--skip"}
    failed = {n: s.get("error") for n, s in sections.items() if s["status"] == "failed"}
    assert failed == {} and proc.returncode == 0, (failed, proc.stderr[-2000:])


def test_the_files_name_the_device_and_say_it_is_no_gpu_result(quick_run):
    _, data, md = quick_run
    meta = data["meta"]
    assert meta["device"] == "cpu" and meta["device_name"] and meta["quick"] is True
    assert md.startswith(f"# GPU check: {meta['device_name']}")
    assert "CPU smoke run, not GPU results" in md


def test_training_losses_are_finite_falling_and_the_cpus(quick_run):
    _, data, _ = quick_run
    runs = data["sections"]["training"]["results"]["runs"]
    assert set(runs) == {"fp32", "bf16"}
    for name, run in runs.items():
        losses = run["losses"]
        assert len(losses) == run["updates"] >= 8 and all(math.isfinite(x) for x in losses), name
        assert losses[-1] < losses[0], (name, losses)
        assert run["first_loss_rel_diff"] <= run["tolerance"], (name, run)
        assert run["tokens_per_s_overall"] > 0 and run["compile"] is False
    assert runs["bf16"]["precision"] == "bf16" and runs["fp32"]["tolerance"] == 1e-4


def test_trainer_section_times_the_trainers_own_update(quick_run):
    """Trainer.train_step on its own data path, eager, compiled and through DDP over a 1-rank group:
    tokens/s, ms per update, MFU, the compile time apart, and the rows beside the realistic rows."""
    _, data, md = quick_run
    sec = data["sections"]["trainer"]
    assert sec["status"] == "passed", sec
    r = sec["results"]
    assert r["model"] == "base" and r["max_tokens"] == 1024 and r["corpus"]["pairs"] > 0
    rows = {x["mode"]: x for x in r["rows"]}
    assert list(rows) == ["eager", "compiled", "ddp"]
    for x in rows.values():
        assert "error" not in x and "skipped" not in x, x
        assert x["tok_s"] == pytest.approx(x["target_tokens"] * 2 / x["timed_s"])
        assert x["step_ms"] == pytest.approx(1e3 * x["timed_s"] / 2) and x["mfu"] > 0
        assert x["mfu"] == pytest.approx(x["train_flops"] / x["timed_s"] / (r["peak_bf16_tflops"] * 1e12))
        assert x["prefetch"] == 0 and math.isfinite(x["last_loss"])  # train.prefetch=auto on a CPU
    assert rows["compiled"]["compile"] == "eager" and rows["eager"]["compile"] is False
    first, _, timed = rows["compiled"]["graph_counts"]
    assert first >= 1 and timed == 0 and rows["compiled"]["graphs"] == f"{first} / 0 / 0"
    assert rows["compiled"]["compile_s"] > 0 and rows["eager"]["compile_s"] is None
    assert rows["ddp"]["distributed"] == "ddp, 1-rank group" and rows["eager"]["distributed"].startswith("none")
    [target] = r["targets"]
    assert target["target"] == "base_trainer_mfu" and target["status"] == "missed"  # a CPU's MFU
    assert target["detail"].startswith("smoke run, read at its own sizes: ") and "1024 tokens" in target["detail"]
    beside = data["sections"]["realistic"]["results"]["trainer_rows"]
    assert [x["mode"] for x in beside] == ["eager", "compiled", "ddp"]
    assert "| base | Trainer.train_step | compiled | 1024 | WMT-like" in md


def test_decoding_on_the_cpu_equals_the_cpu(quick_run):
    _, data, _ = quick_run
    r = data["sections"]["decoding"]["results"]
    assert r["sentences"] == 50 and [x["search"] for x in r["searches"]] == ["greedy", "beam 5"]
    for x in r["searches"]:
        assert x["equal"] == x["of"] == 50 and x["differing"] == [] and "first_difference" not in x


def test_a_calls_gpu_annotation_does_not_hide_its_cpu_ops():
    """With CUDA activity each ``sdpa_call#i`` range is in the profile twice: the CPU range holding
    the aten op and a ``gpu_user_annotation`` with no CPU children. Either order names the backend
    (the first H200 run marked every call unidentified when the annotation came second)."""
    from benchmarks.gpu_check.sdpa import attribute_backends

    class Event:
        def __init__(self, name, children=(), kernels=()):
            self.name, self.cpu_children, self.kernels = name, list(children), list(kernels)

    op = Event(
        "aten::_scaled_dot_product_efficient_attention",
        [Event("aten::_efficient_attention_forward")],
        [Event("fmha_cutlassF_f32_aligned_64x64_rf_sm80")],
    )
    for order in (
        [Event("sdpa_call#0", [op]), Event("sdpa_call#0")],
        [Event("sdpa_call#0"), Event("sdpa_call#0", [op])],
    ):
        calls = [{}, {}]

        class Prof:
            def __init__(self, events):
                self._events = events

            def events(self):
                return self._events

        attribute_backends(Prof(order), calls)
        assert calls[0] == {"backend": "memory-efficient", "kernels": ["fmha_cutlassF_f32_aligned_64x64_rf_sm80"]}
        assert calls[1] == {"backend": "unidentified", "kernels": []}  # a call the profile never saw


def test_sdpa_section_names_a_cpu_backend_for_every_call(quick_run):
    _, data, md = quick_run
    rows = data["sections"]["sdpa"]["results"]["calls"]
    assert {r["family"] for r in rows} == {"encoder-decoder", "decoder-only"}
    assert {r["phase"] for r in rows} == {"train forward", "greedy decoding", "beam decoding"}
    assert {r["role"] for r in rows if r["family"] == "encoder-decoder"} == {
        "encoder self-attention",
        "decoder self-attention",
        "cross-attention",
    }
    for r in rows:
        assert set(r["backends"]) <= {"flash (CPU)", "math"} and r["backends"], r
        assert set(r["eligible"]) <= {"flash", "math"} and r["eligible"], r
    # the encoder's padding mask is a bool mask; the training decoder passes is_causal without one
    enc = next(r for r in rows if r["role"] == "encoder self-attention")
    dec = next(
        r
        for r in rows
        if r["role"] == "decoder self-attention" and r["phase"] == "train forward" and r["family"] == "encoder-decoder"
    )
    assert enc["mask"] == "bool" and dec["mask"] == "none" and dec["is_causal"] is True
    assert "flash (CPU)" in md


def test_realistic_section_measures_every_planned_row_and_decodes(quick_run):
    _, data, md = quick_run
    sec = data["sections"]["realistic"]
    r = sec["results"]
    rows = {(x["model"], x["system"], x["mode"]): x for x in r["rows"]}
    assert set(rows) == {
        (m, s, mode)
        for m, s in (("base", "ours"), ("base", "HF Marian"), ("llama100m", "ours"), ("llama100m", "HF Llama"))
        for mode in ("eager", "compiled")
    }
    assert [x["mode"] for x in r["rows"]][:4] == ["eager"] * 4  # eager first: the priority order
    for x in r["rows"]:
        assert "error" not in x and "skipped" not in x, x
        assert x["tok_s"] == pytest.approx(x["target_tokens"] / x["step_s"]) and 0 < x["mfu"]
        rows_, length = x["batch"]["rows"], x["batch"]["shape"]["target"][1]
        assert x["max_tokens"] == 256 and x["dims"].startswith(f"{rows_} x ") and rows_ * length > 0
    assert (
        rows[("base", "ours", "compiled")]["graphs"]
        == rows[("base", "HF Marian", "compiled")]["graphs"]
        == "1 / 0 breaks"
    )
    assert rows[("base", "HF Marian", "eager")]["ratio"] == pytest.approx(
        rows[("base", "ours", "eager")]["tok_s"] / rows[("base", "HF Marian", "eager")]["tok_s"]
    )
    assert "ratio" not in rows[("base", "ours", "eager")]
    assert "cudagraphs rows not run: CUDA graphs need a CUDA device" in sec["notes"]
    decoding = {(x["system"], x["strategy"]): x for x in r["decoding"]}
    assert set(decoding) == {(s, k) for s in ("ours", "HF generate", "CTranslate2") for k in ("greedy", "beam5")}
    for x in decoding.values():
        assert x["sentences_per_s"] > 0 and "error" not in x, x
    assert decoding[("HF generate", "greedy")]["equal_to_ours"] == 1.0  # same weights, fp32, greedy
    assert r["decoding_setup"]["sentences"] == 48 and r["decoding_setup"]["batch"] == 16
    assert [t["target"] for t in r["targets"]] == ["base_mfu", "base_vs_marian", "big_mfu", "beam_vs_hf"]
    assert {t["target"]: t["status"] for t in r["targets"]}["big_mfu"] == "not measured"
    assert "| base | ours | eager | 256 |" in md and "| HF generate | beam5 |" in md


def _report(tmp_path, **meta):
    from benchmarks.gpu_check.report import Report

    defaults = {"device": "cpu", "device_name": "test CPU", "quick": True, "budget_s": 0}
    return Report(tmp_path, {**defaults, "command": "x", "date": "d", "commit": "c", "torch": "t", **meta})


def _realistic_ctx(tmp_path):
    """A context for ``section_realistic`` (its data, peak and decoding are replaced in the tests)."""
    import argparse

    import torch

    from benchmarks.gpu_check.context import Context
    from benchmarks.gpu_check.report import Budget

    a = argparse.Namespace(
        quick=True,
        realistic_models=["base", "llama100m"],
        realistic_tokens=[64, 128],
        realistic_modes=["eager", "compiled"],
        realistic_vocab=50,
        realistic_warmup=1,
        realistic_steps=1,
        realistic_budget_s=0.0,
        encdec_peers=["HF Marian"],
        decoder_peers=["HF Llama"],
    )
    return Context(args=a, device=torch.device("cpu"), budget=Budget(0), data_dir=None, work=tmp_path)


def test_a_failing_or_oom_row_is_recorded_and_the_next_rows_run(tmp_path, monkeypatch):
    from benchmarks.gpu_check import realistic

    report = _report(tmp_path)
    ran = []

    def fake_measure(name, system, mode, tokens, ctx, lengths):
        ran.append((name, system, mode, tokens))
        if (name, system, mode) == ("base", "ours", "compiled"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {
            "step_s": 0.5,
            "train_flops": 1e12,
            "tok_s": 100.0,
            "first_step_s": 1.0,
            "params": 10,
            "dims": "2 x 8 x 8",
            "target_tokens": 10,
            "padding": 0.375,
        }

    monkeypatch.setattr(realistic, "measure", fake_measure)
    monkeypatch.setattr(realistic, "bf16_peak", lambda ctx: (4e12, "test"))
    monkeypatch.setattr(realistic, "decode_jobs", lambda sec, ctx, report, data, budget: ran.append("decode"))
    monkeypatch.setattr(realistic, "load_data", lambda ctx: _fake_data())
    ctx = _realistic_ctx(tmp_path)
    sec = report.start("realistic")
    realistic.section_realistic(sec, ctx, report)
    rows = sec["results"]["rows"]
    assert len(rows) == len(ran) - 1 == 2 * 2 * 2 * 2  # models x systems x modes x batch sizes, all tried
    failed = [x for x in rows if "error" in x]
    assert [(x["model"], x["system"], x["mode"]) for x in failed] == [("base", "ours", "compiled")] * 2
    assert "RuntimeError: CUDA out of memory" in failed[0]["error"]
    assert all(x["mfu"] == 0.5 for x in rows if "error" not in x)  # 1e12 FLOP / 0.5 s / 4e12 FLOP/s
    assert ran.index("decode") == 4  # after the eager rows at the first batch size
    assert "rows that failed" in sec["notes"][-1]


def _fake_data():
    import types

    import numpy as np

    class Split:
        src_lengths = np.array([5, 6, 7, 8] * 10)
        tgt_lengths = np.array([6, 6, 9, 7] * 10)

        def __len__(self):
            return 40

    return types.SimpleNamespace(splits={"train": Split()}, src_tokenizer=[0] * 50)


def test_rows_past_the_sections_budget_are_recorded_as_skipped(tmp_path, monkeypatch):
    from benchmarks.gpu_check import realistic

    gc = load_gpu_check()
    report = _report(tmp_path)
    monkeypatch.setattr(realistic, "bf16_peak", lambda ctx: (4e12, "test"))
    monkeypatch.setattr(realistic, "decode_jobs", lambda *a: None)
    monkeypatch.setattr(realistic, "load_data", lambda ctx: _fake_data())
    ctx = _realistic_ctx(tmp_path)
    ctx.args.realistic_budget_s = 1e-9  # spent before the first row
    report.data["skipped_for_time"] = ctx.budget.skipped
    report.run("realistic", lambda sec: realistic.section_realistic(sec, ctx, report))
    sec = report.data["sections"]["realistic"]
    assert sec["results"]["rows"] and all("of the 0 s budget left" in x["skipped"] for x in sec["results"]["rows"])
    # nothing fitted: the section is skipped for time (not failed), its rows kept and listed
    assert sec["status"] == "skipped" and sec["reason"].startswith("time budget: every row skipped")
    assert sec["checks"] == [] and len(ctx.budget.skipped) == len(sec["results"]["rows"])
    md = gc.markdown(report.data)
    assert "| base | ours | eager | 64 | skipped: base ours eager 64: skipped" in md
    assert f"Skipped for the time budget ({len(ctx.budget.skipped)};" in md
    assert "- base ours eager 64: skipped, 0 s of the 0 s budget left, ~12 s needed" in md


def test_the_plan_runs_what_is_needed_most_first():
    from benchmarks.gpu_check.realistic import plan

    systems = {"encoder-decoder": ["ours", "HF Marian"], "decoder-only": ["ours", "HF Llama"]}
    rows = plan(["base", "big", "llama100m"], [16384, 8192], ["eager", "compiled", "cudagraphs"], systems)
    assert rows[:7] == [
        ("train", "base", 16384, "eager", "ours"),
        ("train", "base", 16384, "eager", "HF Marian"),
        ("train", "big", 16384, "eager", "ours"),
        ("train", "big", 16384, "eager", "HF Marian"),
        ("train", "llama100m", 16384, "eager", "ours"),
        ("train", "llama100m", 16384, "eager", "HF Llama"),
        ("decode",),
    ]
    assert rows[7:11] == [
        ("train", "base", 16384, m, s) for m in ("compiled", "cudagraphs") for s in ("ours", "HF Marian")
    ]
    assert rows[15:21] == [
        ("train", m, 8192, "eager", s)
        for m, p in (("base", "HF Marian"), ("big", "HF Marian"), ("llama100m", "HF Llama"))
        for s in ("ours", p)
    ]
    assert len(rows) == 3 * 2 * 3 * 2 + 1 and len(set(rows)) == len(rows)


def test_the_batch_is_the_median_full_batch_of_the_projects_batching():
    import numpy as np

    from benchmarks.gpu_check.batches import make_tensors, representative_batch

    src = np.array([3] * 30 + [10] * 30 + [20] * 8)
    tgt = np.array([4] * 30 + [12] * 30 + [30] * 8)
    lb = representative_batch(src, tgt, 128, "encoder_decoder")
    # item lengths max(src, tgt) + 1 = 5, 13, 31 -> rounded 8, 16, 32: batches of 16, 8 and 4 rows; the
    # full ones by length: 8, 16, 16, 16, 32, 32 (the 14-row and 6-row rests are not full): the middle is 16
    assert lb.rows == 8 and set(lb.src) == {10} and set(lb.tgt) == {12}
    assert lb.target_tokens == 8 * 13 and lb.batches_in_epoch == 2 + 4 + 2
    t = make_tensors(lb, "encoder_decoder", vocab=50)
    assert t["src"].shape == (8, 16) and t["prev"].shape == t["target"].shape == (8, 16)
    assert (t["src"][:, 10] == 3).all() and (t["prev"][:, 0] == 2).all() and (t["target"][:, 12] == 3).all()
    assert (t["prev"][:, 1:13] == t["target"][:, :12]).all() and (t["target"][:, 13:] == 0).all()
    d = representative_batch(
        src, tgt, 256, "decoder_only"
    )  # items 3 + 1 + 4 = 8, 23 -> 24, 51 -> 56: full 24 x 3, 56 x 2
    t = make_tensors(d, "decoder_only", vocab=50)
    assert d.rows == 10 and t["tokens"].shape == t["target"].shape == (10, 24)
    assert (t["tokens"][:, 10] == 4).all() and (t["target"][:, :10] == 0).all() and (t["target"][:, 22] == 3).all()
    assert (t["tokens"][:, 11:23] == t["target"][:, 10:22]).all()


def test_the_flops_count_real_tokens_only():
    import numpy as np

    from benchmarks.gpu_check.batches import LengthBatch, real_train_flops
    from benchmarks.gpu_check.presets import model_config
    from transformer.models.flops import forward_flops

    cfg, _, _ = model_config("base", quick=True)
    lb = LengthBatch(64, np.array([3, 5, 5]), np.array([4, 6, 6]), 1)
    expected = 3 * (forward_flops(cfg, 50, 4, 5)["total"] + 2 * forward_flops(cfg, 50, 6, 7)["total"])
    assert real_train_flops(cfg, lb.src, lb.tgt, 50) == pytest.approx(expected)
    dec, _, _ = model_config("llama100m", quick=True)
    one = LengthBatch(64, np.array([3]), np.array([4]), 1)  # 3 + 1 + 4 positions, logits at the last 5
    assert real_train_flops(dec, one.src, one.tgt, 50) == pytest.approx(
        3 * (forward_flops(dec, 50, 3, 4)["total"] - 2 * 3 * 32 * 50)
    )


def test_the_targets_read_the_best_rows():
    from benchmarks.gpu_check.realistic import evaluate_targets

    def row(model, system, mode, tokens, tok_s, mfu):
        return {"model": model, "system": system, "mode": mode, "max_tokens": tokens, "tok_s": tok_s, "mfu": mfu}

    rows = [
        row("base", "ours", "eager", 16384, 100.0, 0.30),
        row("base", "ours", "compiled", 16384, 140.0, 0.40),
        row("base", "HF Marian", "eager", 16384, 90.0, 0.2),
        row("base", "HF Marian", "compiled", 16384, 100.0, 0.2),
        row("base", "ours", "eager", 8192, 80.0, 0.5),
        row("base", "HF Marian", "eager", 8192, 50.0, 0.1),
        {"model": "big", "system": "ours", "mode": "eager", "max_tokens": 16384, "error": "OOM"},
    ]
    decoding = [
        {"system": "ours", "strategy": "beam5", "sentences_per_s": 60.0},
        {"system": "HF generate", "strategy": "beam5", "sentences_per_s": 20.0},
    ]
    t = {x["target"]: x for x in evaluate_targets(rows, decoding)}
    assert (t["base_mfu"]["value"], t["base_mfu"]["status"]) == (0.40, "met")  # 8192 tokens is below the bound
    assert t["base_vs_marian"]["value"] == pytest.approx(1.4) and t["base_vs_marian"]["status"] == "met"
    assert (
        "8192: 1.60x (ours eager / Marian eager); 16384: 1.40x (ours compiled / Marian compiled)"
        == t["base_vs_marian"]["detail"]
    )
    assert (t["big_mfu"]["value"], t["big_mfu"]["status"]) == (None, "not measured")
    assert (t["beam_vs_hf"]["value"], t["beam_vs_hf"]["status"]) == (3.0, "missed")


# ----------------------------------------------------------------------------- pieces


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path):
    gc = load_gpu_check()
    report = _report(tmp_path)
    seen = {}

    def broken(sec):
        sec["results"]["done"] = 1
        seen["while_running"] = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]["training"]["status"]
        raise ValueError("boom")

    def fine(sec):
        gc.check(sec, "holds", True)

    def unmet(sec):
        gc.check(sec, "does not hold", False, "why")

    report.run("training", broken)
    report.run("decoding", fine)
    report.run("sdpa", unmet)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]
    assert seen["while_running"] == "running"
    assert saved["training"]["status"] == "failed" and "ValueError: boom" in saved["training"]["error"]
    assert saved["training"]["results"] == {"done": 1} and "Traceback" in saved["training"]["traceback"]
    assert saved["decoding"]["status"] == "passed"
    assert saved["sdpa"]["status"] == "failed" and "does not hold" in saved["sdpa"]["error"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| training | failed |" in md and "| realistic | not run |" in md

    def stopped(sec):
        raise gc.Stopped("stopped by signal SIGTERM")

    with pytest.raises(gc.Stopped):
        report.run("realistic", stopped)
    assert json.loads((tmp_path / "gpu_check.json").read_text())["sections"]["realistic"]["status"] == "failed"


def test_budget_and_device_peaks():
    gc = load_gpu_check()
    with pytest.raises(gc.OutOfTime, match="30 s needed"):
        gc.Budget(1).need(30, "a run")
    gc.Budget(0).need(1e9, "no limit")
    assert gc.device_peak("Some Future GPU", "bf16") is None


@pytest.mark.parametrize(
    ("name", "tflops"),
    [  # torch.cuda.get_device_name() of each card: its dense bf16 tensor-core peak (NVIDIA's datasheets)
        ("NVIDIA H100 80GB HBM3", 989),  # SXM
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA GH200 480GB", 989),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A100-SXM4-40GB", 312),
        ("NVIDIA A100-PCIE-40GB", 312),
        ("NVIDIA A100 80GB PCIe", 312),
        ("NVIDIA L40S", 362),
        ("NVIDIA L40", 181),
        ("NVIDIA L4", 121),
    ],
)
def test_the_peak_table_knows_the_data_centre_gpus(name, tflops):
    gc = load_gpu_check()
    assert gc.device_peak(name, "bf16") == tflops * 1e12


def test_the_check_fits_one_device_call_and_leaves_one_for_a_rerun():
    """The defaults: the check's sections within 320 s, its hard cap 360 s (one 600 s device call
    with minutes spare, and a second call for a rerun within a 15-minute device session), the study
    only when asked; each section skipped with its reason when too little time is left."""
    gc = load_gpu_check()
    args = gc.apply_defaults(gc.build_parser().parse_args([]))
    assert args.budget_s == 320 and args.realistic_budget_s <= args.budget_s
    script = (REPO_ROOT / "scripts" / "gpu_check.sh").read_text()
    assert "CHECK_S=${CHECK_S:-360}" in script and "TOTAL_S=${TOTAL_S:-540}" in script
    assert "STUDY=${STUDY:-0}" in script and "--budget-s $(( CHECK_S - 40 ))" in script
    assert args.trainer_modes == ["eager", "compiled", "ddp"] and args.compile_precision == ["bf16", "fp32"]
    assert (args.trainer_tokens, args.trainer_vocab, args.trainer_mean_len) == (16384, 32000, 27.0)


def test_a_section_out_of_time_is_skipped_with_its_reason(tmp_path, monkeypatch):
    from benchmarks.gpu_check import trainer_rows

    gc = load_gpu_check()
    report = _report(tmp_path, device="cuda", device_name="test GPU", quick=False, budget_s=1)
    ctx = _realistic_ctx(tmp_path)
    ctx.budget = gc.Budget(1e-9)
    ctx.args.trainer_modes, ctx.args.trainer_model, ctx.args.trainer_tokens = ["eager", "compiled"], "base", 16384
    report.data["skipped_for_time"] = ctx.budget.skipped
    monkeypatch.setattr(trainer_rows, "bf16_peak", lambda ctx: (1e15, "test"))
    monkeypatch.setattr(trainer_rows, "wmt_like_data", lambda ctx: pytest.fail("no data is loaded for a skip"))
    report.run("trainer", lambda sec: trainer_rows.section_trainer(sec, ctx, report))
    sec = report.data["sections"]["trainer"]
    assert sec["status"] == "skipped" and "trainer base eager: skipped" in sec["reason"]
    assert [x["mode"] for x in sec["results"]["rows"]] == ["eager", "compiled"]
    assert ctx.budget.skipped == [x["skipped"] for x in sec["results"]["rows"]]
    md = gc.markdown(report.data)
    assert "| trainer | skipped |" in md and "- trainer base compiled: skipped, 0 s of the 0 s budget left" in md


def test_wmt_like_split_joins_consecutive_pairs_to_wmt_lengths():
    import numpy as np

    from benchmarks.gpu_check.trainer_rows import length_summary, wmt_like_split
    from transformer.data.dataset import ParallelDataset

    rng = np.random.default_rng(3)
    n = 20000  # Multi30k-like: about 15 pieces a side
    src = [list(rng.integers(5, 300, size=int(k))) for k in rng.poisson(14, n) + 1]
    tgt = [list(rng.integers(5, 300, size=int(k))) for k in rng.poisson(14, n) + 1]
    joined = wmt_like_split(ParallelDataset(src, tgt, None, None, "train"), 27.0, max_side=250)
    c = length_summary(joined)
    assert 25 <= c["mean_tgt_len"] <= 29 and c["max_tgt_len"] >= 128 and 0 < c["share_tgt_ge_128"] < 0.01
    assert max(joined.src_lengths.max(), joined.tgt_lengths.max()) <= 250
    # every pair once, in order, each side joined with its own translations
    assert [t for s in joined.src for t in s] == [t for s in src for t in s]
    assert [t for s in joined.tgt for t in s] == [t for s in tgt for t in s]
    assert joined.src_lengths.sum() == sum(map(len, src)) and len(joined) < n / 1.5
    first = len(joined.tgt[0])
    k = next(i for i in range(1, n + 1) if sum(map(len, tgt[:i])) == first)
    assert joined.src[0] == [t for s in src[:k] for t in s]  # source and target cut at the same pair
    assert wmt_like_split(ParallelDataset(src, tgt, None, None, "train"), 5.0).tgt_lengths.tolist() == [
        len(t) for t in tgt
    ]  # pairs already longer than asked stay one by one


def test_study_summary_reads_run_folders(tmp_path):
    """Summarised on another machine (a CPU), a finished GPU run still says where it trained; an
    unfinished one shows how far it got."""
    gc = load_gpu_check()
    running, finished = tmp_path / "runs" / "ladder" / "step0_vaswani2017_seed1", tmp_path / "runs" / "length" / "l"
    for run, device in ((running, "cuda"), (finished, "auto")):
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(f"train:\n  precision: fp32\n  device: {device}\n  max_updates: 6000\n")
    train = {"split": "train", "update": 200, "loss": 5.0, "tokens_per_s": 1234.0}
    valid = {"split": "valid", "update": 200, "loss": 4.5, "bleu": 3.2}
    (running / "metrics.jsonl").write_text(json.dumps(train) + "\n" + json.dumps(valid) + "\n")
    (finished / "metrics.jsonl").write_text(json.dumps({"split": "train", "update": 6000}) + "\n")
    results = {"bleu": 32.8521778950228, "device": "cuda:0", "precision": "fp32", "hardware": {"gpu": "NVIDIA H200"}}
    (finished / "results.json").write_text(json.dumps(results))
    res = gc.study_summary(tmp_path / "runs", tmp_path / "sum", "CPU AMD EPYC", "a note")
    assert res["device_name"] == "NVIDIA H200" and [x["run"] for x in res["runs"]] == [
        "ladder/step0_vaswani2017_seed1",
        "length/l",
    ]
    assert res["runs"][0] == {
        "run": "ladder/step0_vaswani2017_seed1",
        "device": "cuda",
        "precision": "fp32",
        "updates": "200 / 6000",
        "tokens_per_s": 1234.0,
        "last_valid": "200: 4.500 / 3.20",
        "finished": False,
        "test_bleu": None,
    }
    md = (tmp_path / "sum" / "study_progress.md").read_text()
    assert md.startswith("# results_gpu.sh study on NVIDIA H200") and "a note" in md
    assert "| ladder/step0_vaswani2017_seed1 | cuda | fp32 | 200 / 6000 | 1,234 | 200: 4.500 / 3.20 | False |" in md
    assert "| length/l | cuda:0 (NVIDIA H200) | fp32 | 6000 / 6000 |  |  | True | 32.85 |" in md


def test_gpu_check_sh_preflight_says_what_is_there(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(CHECK="0", STUDY="0", OUT=str(out), WORK=str(tmp_path / "work"), PYTHON=sys.executable),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (out / "preflight.txt").read_text()
    assert "required packages: all present" in text and f"Multi30k: {SHARED_DATA.resolve()}" in text
    assert "cuda available" in text


def test_gpu_check_sh_stops_when_a_package_is_missing(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # -S: no site-packages
    (fake / "python").chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(OUT=str(out), WORK=str(tmp_path / "work"), PYTHON=str(fake / "python"), WHEELS=str(tmp_path / "none")),
    )
    assert proc.returncode == 2
    assert "MISSING required packages: torch" in (out / "preflight.txt").read_text()
    assert "stopping: required packages missing" in proc.stdout


# ----------------------------------------------------------------------------- the study scripts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The first lines of Multi30k en-de as plain ``{split}.{lang}`` files."""
    if not HAVE_DATA:
        pytest.skip(f"real Multi30k data not found under {SHARED_DATA}")
    return multi30k_excerpt(tmp_path_factory.mktemp("corpus"), {"train": 600, "val": 40, "test_2016_flickr": 30})


def _tiny_extra(corpus: Path, updates: int = 2) -> str:
    """EXTRA for results_gpu.sh: the corpus slice, a 1+1-layer model, ``updates`` updates, greedy."""
    return " ".join(
        [
            *parallel_text_args(corpus, 300),
            "model.n_encoder_layers=1",
            "model.n_decoder_layers=1",
            "model.d_model=32",
            "model.n_heads=4",
            "model.d_ff=64",
            "train.max_tokens=600",
            f"train.max_updates={updates}",
            "train.validate_every=0",
            "train.valid_bleu=false",
            "train.save_every=0",
            "train.average_last=0",
            "generation.beam_size=1",
            "generation.max_len_a=0",
            "generation.max_len_b=5",
        ]
    )


def _study_env(corpus: Path, out: Path, **extra: str) -> dict[str, str]:
    return _env(
        **{
            "DEVICE": "cpu",
            "SEEDS": "1",
            "PREPROCESS": "0",
            "EXTRA": _tiny_extra(corpus),
            "OUT": str(out),
            "PYTHON": sys.executable,
            **extra,
        }
    )


@pytest.mark.slow
def test_results_gpu_sh_smoke_on_the_cpu(corpus, tmp_path):
    out = tmp_path / "study"
    proc = subprocess.run(
        ["bash", "scripts/results_gpu.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=_study_env(corpus, out, STEPS="step0_vaswani2017 step6_decoder_only", WU="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 runs in" in proc.stderr and "0 failed" in proc.stderr
    for run in ("ladder/step0_vaswani2017_seed1", "ladder/step6_decoder_only_seed1", "wu2021_tiny/seed1"):
        results = json.loads((out / run / "results.json").read_text())
        assert results["updates"] == 2 and results["precision"] == "fp32", run  # the ladder's pinned precision
    assert (out / "ladder_comparison" / "comparison.md").is_file()


@pytest.mark.slow
def test_results_gpu_sh_runs_named_length_runs_and_wu_seeds_only(corpus, tmp_path):
    out = tmp_path / "study"
    proc = subprocess.run(
        ["bash", "scripts/results_gpu.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=_study_env(corpus, out, STEPS="", LENGTH="alibi", SEEDS="2", WU="1", WU_SEEDS="2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 runs in" in proc.stderr and "0 failed" in proc.stderr
    assert not (out / "ladder").exists()  # STEPS empty: no ladder run
    length = json.loads((out / "length" / "alibi_seed2" / "results.json").read_text())
    wu = json.loads((out / "wu2021_tiny" / "seed2" / "results.json").read_text())
    assert length["config"]["seed"] == 2 and wu["config"]["seed"] == 2
    config = (out / "length" / "alibi_seed2" / "config.yaml").read_text()
    assert "train_max_target_tokens: 15" in config and "name: alibi" in config  # the length experiment's own run


def test_results_gpu_sh_counts_runs_cut_by_the_time_limit(corpus, tmp_path):
    out = tmp_path / "study"
    proc = subprocess.run(
        ["bash", "scripts/results_gpu.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=_study_env(corpus, out, STEPS="step0_vaswani2017", WU="0", TIME_LIMIT="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 failed, 1 stopped by TIME_LIMIT" in proc.stderr


@pytest.mark.slow
def test_gpu_check_sh_runs_the_study_and_keeps_only_small_files(corpus, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=_study_env(corpus, out, CHECK="0", STUDY="1", WORK=str(work), STEPS="step0_vaswani2017", WU="0"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    copied = {p.relative_to(out / "study").as_posix() for p in (out / "study").rglob("*") if p.is_file()}
    run = "ladder/step0_vaswani2017_seed1"
    assert {f"{run}/results.json", f"{run}/metrics.jsonl", f"{run}/config.yaml", "study_progress.md"} <= copied
    assert not [p for p in copied if "checkpoint" in p], copied
    assert (work / "study" / run / "checkpoint_last.safetensors").is_file()  # checkpoints stay in WORK
    summary = json.loads((out / "study" / "study_progress.json").read_text())
    assert summary["runs"][0]["finished"] and summary["runs"][0]["device"] == "cpu"
    assert (out / "gpu_check_sh.log").is_file() and (out / "preflight.txt").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a CUDA device runs the check")
def test_device_cuda_without_one_and_without_out_writes_nothing(tmp_path, capsys):
    """The default ``--out`` of ``--device cuda`` is the recorded GPU results: a machine without a GPU
    leaves them as they are."""
    from benchmarks.gpu_check.cli import main

    recorded = REPO_ROOT / "docs" / "benchmarks" / "gpu" / "gpu_check.md"
    before = recorded.read_bytes()
    assert main(["--device", "cuda", "--work", str(tmp_path)]) == 2
    assert "sees no CUDA device; nothing written" in capsys.readouterr().err
    assert recorded.read_bytes() == before and not any(tmp_path.iterdir())
