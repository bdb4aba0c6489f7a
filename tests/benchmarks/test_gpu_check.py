"""The GPU check (issue #21 item 5) on the CPU: ``benchmarks/gpu_check.py --device cpu --quick`` end
to end, its report's pieces, and the shell scripts around it (``scripts/gpu_check.sh``,
``scripts/results_gpu.sh``) on a slice of Multi30k.

No GPU runs here: the CPU smoke mode exercises every section's code (the trainer, the decoder, the
SDPA profile, the throughput rows) with the CPU standing in for the device, so decoding parity
and the first-step loss are trivially equal; the GPU results come from ``scripts/gpu_check.sh`` on
a GPU machine.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, SHARED_DATA

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_check.py"
HAVE_DATA = (SHARED_DATA / "multi30k" / "train.en.gz").is_file()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"real Multi30k data not found under {SHARED_DATA}")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TRANSFORMER_DATA_DIR": str(SHARED_DATA), "OMP_NUM_THREADS": "1", **extra}


def load_gpu_check():
    """``benchmarks/gpu_check.py`` as a module."""
    spec = importlib.util.spec_from_file_location("_bench_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One CPU smoke run of every section but training_compile (compiling takes minutes on 2 cores)."""
    if not HAVE_DATA:
        pytest.skip(f"real Multi30k data not found under {SHARED_DATA}")
    tmp = tmp_path_factory.mktemp("gpu_check")
    out = tmp / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out), "--work", str(tmp / "work"),
         "--skip", "training_compile"],
        capture_output=True, text=True, env=_env(), timeout=900, cwd=REPO_ROOT,
    )
    assert (out / "gpu_check.json").is_file(), proc.stderr[-3000:]
    return proc, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_every_section_is_recorded_with_a_status(quick_run):
    proc, data, md = quick_run
    gc = load_gpu_check()
    sections = data["sections"]
    assert set(sections) == set(gc.SECTIONS)
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


def test_decoding_on_the_cpu_equals_the_cpu(quick_run):
    _, data, _ = quick_run
    r = data["sections"]["decoding"]["results"]
    assert r["sentences"] == 50
    for key in ("greedy", "beam5"):
        assert r[key]["equal"] == r[key]["of"] == 50 and r[key]["differing"] == []


def test_a_calls_gpu_annotation_does_not_hide_its_cpu_ops():
    """With CUDA activity each ``sdpa_call#i`` range is in the profile twice: the CPU range holding
    the aten op and a ``gpu_user_annotation`` with no CPU children. Either order names the backend
    (the first H200 run marked every call unidentified when the annotation came second)."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        from gpu_check_sdpa import attribute_backends
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))

    class Event:
        def __init__(self, name, children=(), kernels=()):
            self.name, self.cpu_children, self.kernels = name, list(children), list(kernels)

    op = Event("aten::_scaled_dot_product_efficient_attention", [Event("aten::_efficient_attention_forward")],
               [Event("fmha_cutlassF_f32_aligned_64x64_rf_sm80")])
    for order in ([Event("sdpa_call#0", [op]), Event("sdpa_call#0")],
                  [Event("sdpa_call#0"), Event("sdpa_call#0", [op])]):
        calls = [{}, {}]

        class Prof:
            def events(self):
                return order

        attribute_backends(Prof(), calls)
        assert calls[0] == {"backend": "memory-efficient", "kernels": ["fmha_cutlassF_f32_aligned_64x64_rf_sm80"]}
        assert calls[1] == {"backend": "unidentified", "kernels": []}  # a call the profile never saw


def test_sdpa_section_names_a_cpu_backend_for_every_call(quick_run):
    _, data, md = quick_run
    rows = data["sections"]["sdpa"]["results"]["calls"]
    assert {r["family"] for r in rows} == {"encoder-decoder", "decoder-only"}
    assert {r["phase"] for r in rows} == {"train forward", "greedy decoding", "beam decoding"}
    assert {r["role"] for r in rows if r["family"] == "encoder-decoder"} == {
        "encoder self-attention", "decoder self-attention", "cross-attention"}
    for r in rows:
        assert set(r["backends"]) <= {"flash (CPU)", "math"} and r["backends"], r
        assert set(r["eligible"]) <= {"flash", "math"} and r["eligible"], r
    # the encoder's padding mask is a bool mask; the training decoder passes is_causal without one
    enc = next(r for r in rows if r["role"] == "encoder self-attention")
    dec = next(r for r in rows if r["role"] == "decoder self-attention" and r["phase"] == "train forward"
               and r["family"] == "encoder-decoder")
    assert enc["mask"] == "bool" and dec["mask"] == "none" and dec["is_causal"] is True
    assert "flash (CPU)" in md


def test_throughput_rows_have_ours_and_the_peers_or_a_reason(quick_run):
    _, data, _ = quick_run
    r = data["sections"]["throughput"]["results"]
    rows = r["rows"]
    assert {(x["family"], x["precision"]) for x in rows if x["model"] == "ours" and x.get("tok_s", 0) > 0} == {
        (f, p) for f in ("encoder-decoder", "decoder-only") for p in ("fp32", "bf16")}
    for x in rows:
        assert "tok_s" in x or x.get("skipped"), x
        if "tok_s" in x:
            assert 0 < x["mfu_vs_bf16_peak"] and x["step_ms"] > 0
    assert {x["model"] for x in rows} == {"ours", "HF Marian", "HF Llama"}
    assert set(r["peaks_tflops"]) == {"bf16", "fp32"}


# ----------------------------------------------------------------------------- pieces


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path):
    gc = load_gpu_check()
    report = gc.Report(tmp_path, {"device": "cpu", "device_name": "test CPU", "command": "x", "date": "d",
                                  "commit": "c", "torch": "t", "quick": True, "budget_s": 0})
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
    assert "| training | failed |" in md and "| throughput | not run |" in md

    def stopped(sec):
        raise gc.Stopped("stopped by signal SIGTERM")

    with pytest.raises(gc.Stopped):
        report.run("throughput", stopped)
    assert json.loads((tmp_path / "gpu_check.json").read_text())["sections"]["throughput"]["status"] == "failed"


def test_budget_and_device_peaks():
    gc = load_gpu_check()
    with pytest.raises(gc.OutOfTime, match="30 s needed"):
        gc.Budget(1).need(30, "a run")
    gc.Budget(0).need(1e9, "no limit")
    assert gc.device_peak("NVIDIA H200", "bf16") == 989e12
    assert gc.device_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert gc.device_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert gc.device_peak("Some Future GPU", "bf16") is None


def test_study_summary_reads_run_folders(tmp_path):
    gc = load_gpu_check()
    run = tmp_path / "runs" / "ladder" / "step0_vaswani2017_seed1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(
        json.dumps({"split": "train", "update": 200, "loss": 5.0, "tokens_per_s": 1234.0}) + "\n"
        + json.dumps({"split": "valid", "update": 200, "loss": 4.5, "bleu": 3.2}) + "\n")
    (run / "config.yaml").write_text("train:\n  precision: fp32\n  device: cuda\n  max_updates: 6000\n")
    res = gc.study_summary(tmp_path / "runs", tmp_path / "sum", "NVIDIA H200", "a note")
    assert res["runs"] == [{"run": "ladder/step0_vaswani2017_seed1", "updates": 200, "precision": "fp32",
                            "device": "cuda", "max_updates": 6000, "tokens_per_s": 1234.0,
                            "last_valid": {"update": 200, "loss": 4.5, "bleu": 3.2}, "finished": False,
                            "test_bleu": None, "wall_time_s": None}]
    md = (tmp_path / "sum" / "study_progress.md").read_text()
    assert "NVIDIA H200" in md and "| ladder/step0_vaswani2017_seed1 | cuda | fp32 | 200 / 6000 |" in md


def test_study_summary_names_the_device_a_finished_run_records(tmp_path):
    """Summarised on another machine (a CPU), finished GPU runs still say where they trained."""
    gc = load_gpu_check()
    run = tmp_path / "runs" / "length" / "learned_seed2"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"split": "train", "update": 6000, "tokens_per_s": 9.0}) + "\n")
    (run / "config.yaml").write_text("train:\n  precision: fp32\n  device: auto\n  max_updates: 6000\n")
    (run / "results.json").write_text(json.dumps({"bleu": 32.8521778950228, "device": "cuda:0", "precision": "fp32",
                                                  "hardware": {"gpu": "NVIDIA H200"}}))
    res = gc.study_summary(tmp_path / "runs", tmp_path / "sum", "CPU AMD EPYC", "a note")
    assert res["device_name"] == "NVIDIA H200" and res["runs"][0]["device"] == "cuda:0 (NVIDIA H200)"
    md = (tmp_path / "sum" / "study_progress.md").read_text()
    assert md.startswith("# results_gpu.sh study on NVIDIA H200")
    assert "| length/learned_seed2 | cuda:0 (NVIDIA H200) | fp32 | 6000 / 6000 |" in md and "| yes | 32.85 |" in md


def test_gpu_check_sh_preflight_says_what_is_there(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=_env(CHECK="0", STUDY="0", OUT=str(out), WORK=str(tmp_path / "work"),
                                   PYTHON=sys.executable))
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
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env=_env(OUT=str(out), WORK=str(tmp_path / "work"), PYTHON=str(fake / "python"),
                                   WHEELS=str(tmp_path / "none")))
    assert proc.returncode == 2
    assert "MISSING required packages: torch" in (out / "preflight.txt").read_text()
    assert "stopping: required packages missing" in proc.stdout


# ----------------------------------------------------------------------------- the study scripts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The first lines of Multi30k en-de as plain ``{split}.{lang}`` files."""
    if not HAVE_DATA:
        pytest.skip(f"real Multi30k data not found under {SHARED_DATA}")
    root = tmp_path_factory.mktemp("corpus")
    for split, n in {"train": 600, "val": 40, "test_2016_flickr": 30}.items():
        for lang in ("en", "de"):
            with gzip.open(SHARED_DATA / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                (root / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    return root


def _tiny_extra(corpus: Path, updates: int = 2) -> str:
    """EXTRA for results_gpu.sh: the corpus slice, a 1+1-layer model, ``updates`` updates, greedy."""
    return " ".join([
        "data=parallel_text", f"data.root={corpus}", "data.src_lang=en", "data.tgt_lang=de", "data.train_prefix=train",
        "data.valid_prefix=val", "data.test_prefix=test_2016_flickr", "data.test_splits=[test_2016_flickr]",
        "data.vocab_size=300", f"data.cache_dir={corpus}/cache", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
        "model.d_model=32", "model.n_heads=4", "model.d_ff=64", "train.max_tokens=600", f"train.max_updates={updates}",
        "train.validate_every=0", "train.valid_bleu=false", "train.save_every=0", "train.average_last=0",
        "generation.beam_size=1", "generation.max_len_a=0", "generation.max_len_b=5",
    ])


def _study_env(corpus: Path, out: Path, **extra: str) -> dict[str, str]:
    return _env(**{"DEVICE": "cpu", "SEEDS": "1", "PREPROCESS": "0", "EXTRA": _tiny_extra(corpus), "OUT": str(out),
                   "PYTHON": sys.executable, **extra})


@pytest.mark.slow
def test_results_gpu_sh_smoke_on_the_cpu(corpus, tmp_path):
    out = tmp_path / "study"
    proc = subprocess.run(["bash", "scripts/results_gpu.sh"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600, env=_study_env(corpus, out, STEPS="step0_vaswani2017 step6_decoder_only", WU="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 runs in" in proc.stderr and "0 failed" in proc.stderr
    for run in ("ladder/step0_vaswani2017_seed1", "ladder/step6_decoder_only_seed1", "wu2021_tiny/seed1"):
        results = json.loads((out / run / "results.json").read_text())
        assert results["updates"] == 2 and results["precision"] == "fp32", run  # the ladder's pinned precision
    assert (out / "ladder_comparison" / "comparison.md").is_file()


@pytest.mark.slow
def test_results_gpu_sh_runs_named_length_runs_and_wu_seeds_only(corpus, tmp_path):
    out = tmp_path / "study"
    proc = subprocess.run(["bash", "scripts/results_gpu.sh"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600, env=_study_env(corpus, out, STEPS="", LENGTH="alibi", SEEDS="2", WU="1",
                                                      WU_SEEDS="2"))
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
    proc = subprocess.run(["bash", "scripts/results_gpu.sh"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300, env=_study_env(corpus, out, STEPS="step0_vaswani2017", WU="0", TIME_LIMIT="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 failed, 1 stopped by TIME_LIMIT" in proc.stderr


@pytest.mark.slow
def test_gpu_check_sh_runs_the_study_and_keeps_only_small_files(corpus, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env=_study_env(corpus, out, CHECK="0", WORK=str(work), STEPS="step0_vaswani2017", WU="0"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    copied = {p.relative_to(out / "study").as_posix() for p in (out / "study").rglob("*") if p.is_file()}
    run = "ladder/step0_vaswani2017_seed1"
    assert {f"{run}/results.json", f"{run}/metrics.jsonl", f"{run}/config.yaml", "study_progress.md"} <= copied
    assert not [p for p in copied if "checkpoint" in p], copied
    assert (work / "study" / run / "checkpoint_last.safetensors").is_file()  # checkpoints stay in WORK
    summary = json.loads((out / "study" / "study_progress.json").read_text())
    assert summary["runs"][0]["finished"] and summary["runs"][0]["device"] == "cpu"
    assert (out / "gpu_check_sh.log").is_file() and (out / "preflight.txt").is_file()
