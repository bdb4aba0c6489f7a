"""transformer.analysis on synthetic run folders: grouping, statistics, missing runs, outputs."""

from __future__ import annotations

import csv
import json
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from transformer.analysis import (
    compare_sweeps,
    describe_machine,
    expected_jobs,
    find_run_dirs,
    load_run,
    to_markdown,
    write_outputs,
)

N_SENT = 60


@pytest.fixture()
def corpus(tmp_path) -> Path:
    """A parallel_text test split of N_SENT pairs (references are the ``de`` side)."""
    root = tmp_path / "corpus"
    root.mkdir()
    rng = random.Random(0)
    words = "ein mann eine frau hund spielt im park auf der straße mit einem ball".split()
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(N_SENT)]
    (root / "test.de").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    (root / "test.en").write_text("".join(f"source {i}\n" for i in range(N_SENT)), encoding="utf-8")
    return root


def _refs(corpus: Path) -> list[str]:
    return (corpus / "test.de").read_text(encoding="utf-8").splitlines()


def _degrade(refs: list[str], frac: float, seed: int) -> list[str]:
    """References with the last word dropped in a fraction ``frac`` of the lines."""
    rng = random.Random(seed)
    return [" ".join(r.split()[:-3]) if rng.random() < frac else r for r in refs]


def _config(corpus: Path, step: str, seed: int) -> dict:
    norm_position = "post" if step.startswith("step0") else "pre"
    return {
        "seed": seed,
        "run_dir": None,
        "experiment_name": "ladder",
        "model": {
            "arch": "encoder_decoder",
            "n_encoder_layers": 2,
            "n_decoder_layers": 2,
            "d_model": 32,
            "n_heads": 4,
            "n_kv_heads": None,
            "attention": "mha",
            "norm_position": norm_position,
            "norm": {"name": "layernorm" if step[:5] in ("step0", "step1") else "rmsnorm"},
        },
        "data": {
            "name": "parallel_text",
            "corpus": "parallel_text",
            "root": str(corpus),
            "src_lang": "en",
            "tgt_lang": "de",
            "train_prefix": "train",
            "valid_prefix": "val",
            "test_prefix": "test",
            "test_splits": ["test"],
            "download": False,
            "bleu_tokenize": "13a",
            "lowercase": False,
            "cache_dir": str(corpus / f"cache{seed}"),
        },
        "train": {"max_updates": 10, "num_threads": seed, "progress": False},
        "logger": {"name": "none"},
    }


def make_run(
    run_dir: Path,
    corpus: Path,
    step: str,
    seed: int,
    hyps: list[str] | None,
    *,
    bleu: float | None = None,
    finished: bool = True,
    params: int = 1000,
    active_params: int | None = None,
) -> Path:
    """A run folder as scripts/train.py writes it (results.json only when ``finished``; without
    ``active_params`` as runs from before the key)."""
    run_dir.mkdir(parents=True)
    cfg = _config(corpus, step, seed)
    choices = {"ladder": step, "experiment": "ladder", "model": "transformer_tiny"}
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text(f"- ladder={step}\n- seed={seed}\n")
    (run_dir / "config.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    with (run_dir / "metrics.jsonl").open("w") as f:
        for u in (5, 10) if finished else (5,):
            f.write(json.dumps({"split": "train", "update": u, "loss": 5.0 - u / 10}) + "\n")
            f.write(
                json.dumps(
                    {
                        "split": "valid",
                        "update": u,
                        "loss": 4.5 - u / 10 - seed / 100,
                        "nll_loss": 4.0 - u / 10 - seed / 100,
                        "bleu": u + seed,
                    }
                )
                + "\n"
            )
        if not finished:
            f.write('{"split": "train", "upd')  # torn by the crash
    if finished:
        (run_dir / "hyps").mkdir()
        (run_dir / "hyps" / "test.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        results = {
            "bleu": bleu,
            "chrf": 2 * bleu,
            "sacrebleu_signature": "nrefs:1|tok:13a",
            "chrf_signature": "nrefs:1|nc:6",
            "test_split": "test",
            "params": params,
            "flops_per_token": 2.0e6,
            "updates": 10,
            "best_valid": 3.0,
            "train_tokens_per_s": 1000.0 * seed,
            "peak_memory_mb": 100.0 + seed,
            "choices": choices,
            "config": cfg,
        }
        if active_params is not None:
            results["active_params"] = active_params
        (run_dir / "results.json").write_text(json.dumps(results))
    return run_dir


@pytest.fixture()
def sweep(tmp_path, corpus) -> Path:
    """step1 (listed first on disk) and step0, 3 seeds each, plus a crashed step1 seed-4 run and an
    unidentifiable folder."""
    root = tmp_path / "sweep"
    refs = _refs(corpus)
    bleus = {"step0_vaswani2017": [20.0, 22.0, 24.0], "step1_pre_ln": [30.0, 31.0, 35.0]}
    n = 0
    for step in ("step1_pre_ln", "step0_vaswani2017"):
        for i, seed in enumerate((1, 2, 3)):
            frac = 0.9 if step.startswith("step0") else 0.05
            make_run(
                root / str(n), corpus, step, seed, _degrade(refs, frac, seed), bleu=bleus[step][i], params=1000 + n // 3
            )
            n += 1
    make_run(root / str(n), corpus, "step1_pre_ln", 4, None, finished=False)
    (root / "7" / ".hydra").mkdir(parents=True)
    (root / "7" / ".hydra" / "overrides.yaml").write_text("- ladder=step9_broken\n- seed=1\n")
    return root


def test_groups_by_config_orders_by_ladder_and_averages_seeds(sweep):
    comp = compare_sweeps([sweep], n_bootstrap=100)
    assert [c.label for c in comp.configurations] == ["step0_vaswani2017", "step1_pre_ln"]
    assert comp.baseline == "step0_vaswani2017"
    base, step1 = comp.rows
    assert base["is_baseline"] and not step1["is_baseline"]
    assert (base["n_runs"], base["n_missing"], base["seeds"]) == (3, 0, "1 2 3")
    assert (step1["n_runs"], step1["n_missing"]) == (3, 1)
    assert base["bleu_mean"] == pytest.approx(22.0)
    assert base["bleu_std"] == pytest.approx(statistics.stdev([20.0, 22.0, 24.0]))
    assert step1["bleu_mean"] == pytest.approx(32.0)
    assert step1["delta_bleu"] == pytest.approx(10.0)
    assert step1["chrf_mean"] == pytest.approx(64.0)
    assert step1["train_tokens_per_s"] == pytest.approx(2000.0)
    assert base["params"] == 1001 and step1["params"] == 1000
    assert base["kv_cache_bytes_per_token"] == 2 * 2 * 4 * 8 * 4  # K and V, 2 layers, 4 heads of 8, fp32


def test_seed_only_differences_do_not_split_a_configuration(sweep):
    # seed, data.cache_dir and train.num_threads differ between seeds (see _config), yet one group each
    comp = compare_sweeps([sweep], n_bootstrap=0)
    assert len(comp.configurations) == 2


def test_p_value_is_paired_bootstrap_against_the_baseline(sweep):
    comp = compare_sweeps([sweep], n_bootstrap=200)
    base, step1 = comp.rows
    assert base["p_value"] is None
    assert 0 < step1["p_value"] < 0.05  # step1 hyps are nearly the references, step0's are truncated
    assert [s.split(":")[0] for s in step1["p_value_seeds"].split()] == ["1", "2", "3"]
    assert "bs:200" in comp.signatures["bootstrap"]


def test_baseline_choice_and_errors(sweep):
    comp = compare_sweeps([sweep], baseline="pre_ln", n_bootstrap=50)
    assert comp.baseline == "step1_pre_ln"
    assert comp.rows[1]["is_baseline"] and comp.rows[0]["p_value"] is not None
    with pytest.raises(ValueError, match="matches no configuration"):
        compare_sweeps([sweep], baseline="step5", n_bootstrap=0)
    with pytest.raises(ValueError, match="several"):
        compare_sweeps([sweep], baseline="step", n_bootstrap=0)
    with pytest.raises(FileNotFoundError):
        compare_sweeps([sweep / "nope"])


def test_identical_hypotheses_get_p_one(tmp_path, corpus):
    refs = _degrade(_refs(corpus), 0.5, 0)
    make_run(tmp_path / "s" / "0", corpus, "step0_vaswani2017", 1, refs, bleu=10.0)
    make_run(tmp_path / "s" / "1", corpus, "step1_pre_ln", 1, refs, bleu=10.0)
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=50)
    assert comp.rows[1]["p_value"] == 1.0
    assert any("identical" in n for n in comp.notes)


def test_tied_scores_are_no_difference_and_untrained_rows_are_left_out(tmp_path, corpus):
    """Two configurations that write a different nonsense word on every line score BLEU 0.00 in every
    resample: p = 1 (not sacreBLEU's smallest p), no star; under the floor, both are untrained, left out
    of the Holm family, and the table says so."""
    refs = _refs(corpus)
    make_run(tmp_path / "s" / "0", corpus, "step0_vaswani2017", 1, _degrade(refs, 0.5, 0), bleu=30.0)
    make_run(tmp_path / "s" / "1", corpus, "step1_pre_ln", 1, ["blub"] * N_SENT, bleu=0.0)
    make_run(tmp_path / "s" / "2", corpus, "step2_rmsnorm", 1, ["quork"] * N_SENT, bleu=0.0)
    floorless = compare_sweeps([tmp_path / "s"], n_bootstrap=100, untrained_below=0.0)
    assert floorless.rows[2]["p_value_prev"] == 1.0 and floorless.rows[2]["p_value_prev_holm"] == 1.0
    assert not any(r["untrained"] for r in floorless.rows)
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=100)
    base, step1, step2 = comp.rows
    assert [r["untrained"] for r in comp.rows] == [False, True, True]
    assert step1["p_value"] < 0.05 and step2["p_value_prev"] == 1.0  # computed, in comparison.csv
    assert step1["p_value_holm"] is step2["p_value_holm"] is step2["p_value_prev_holm"] is None
    assert step1["significant"] is step2["significant_prev"] is None
    md = to_markdown(comp)
    assert "| step1_pre_ln (untrained) | 1/1 | 0.00 | -30.00 | untrained | -30.00 | untrained |" in md
    assert "| step2_rmsnorm (untrained) | 1/1 | 0.00 | -30.00 | untrained | +0.00 | untrained |" in md
    assert "*" not in md.split("| step1_pre_ln")[1].split("\n\n")[0]
    assert any(n.startswith("untrained (mean test BLEU under 1): step1_pre_ln, step2_rmsnorm;") for n in comp.notes)


def test_a_difference_within_the_seed_noise_is_never_starred(tmp_path, corpus):
    """The baseline's two seeds are far apart (a noise floor of 70 BLEU); step1 beats each in its own seed
    pair (per-seed p-values under 0.05, which starred it before), but its Δ is within the noise: no star,
    and the table says why."""
    refs = _refs(corpus)
    runs = {"step0_vaswani2017": [(1, 0.9, 20.0), (2, 0.0, 90.0)], "step1_pre_ln": [(1, 0.3, 40.0), (2, 0.0, 95.0)]}
    n = 0
    for step, seeds in runs.items():
        for seed, frac, bleu in seeds:
            hyps = refs if frac == 0 else _degrade(refs, frac, seed)
            if step == "step1_pre_ln" and seed == 2:
                hyps = [h + " ." for h in refs]  # not the references: a difference, but a small one
            make_run(tmp_path / "s" / str(n), corpus, step, seed, hyps, bleu=bleu)
            n += 1
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=200, compare_prev=False)
    step1 = comp.rows[1]
    seeds = dict(s.split(":") for s in step1["p_value_seeds"].split())
    assert seeds.keys() == {"1", "2"} and all(float(p) < 0.05 for p in seeds.values())
    assert step1["within_noise"] is True and step1["significant"] is False
    assert step1["p_value_holm"] > 0.05  # over seeds: the baseline's own seeds differ by more

    def p_cell(comparison) -> str:
        return to_markdown(comparison).split("| step1_pre_ln | 2/2 |")[1].split("|")[2].strip()

    assert p_cell(comp) == f"{step1['p_value_holm']:.4f}"
    step1["p_value_holm"] = 0.01  # were it under 0.05: marked, not starred
    assert p_cell(comp) == "0.0100 †"
    assert "a Δ marked ≈ is within the seed noise and never starred, its p marked † where under 0.05" in to_markdown(
        comp
    )


def test_missing_runs_are_listed(sweep):
    comp = compare_sweeps([sweep], n_bootstrap=0)
    reasons = {r.run_dir.name: r.reason for r in comp.missing}
    assert set(reasons) == {"6", "7"}
    assert "no results.json (last logged update 5)" in reasons["6"]
    assert "no metrics" in reasons["7"]
    run = load_run(sweep / "6")
    assert not run.ok and run.seed == 4 and len(run.metrics) == 2  # the torn line is skipped


def test_never_started_jobs_of_a_multirun_are_listed(tmp_path, corpus):
    root = tmp_path / "multi"
    refs = _refs(corpus)
    for n, (step, seed) in enumerate([("step0_vaswani2017", 1), ("step0_vaswani2017", 2), ("step1_pre_ln", 1)]):
        make_run(root / str(n), corpus, step, seed, refs, bleu=10.0 + n)
    (root / "multirun.yaml").write_text(
        "hydra:\n"
        "  sweep: {dir: multi, subdir: '${hydra.job.num}'}\n"
        "  sweeper:\n"
        "    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    params: {ladder: 'step0_vaswani2017,step1_pre_ln'}\n"
        "  overrides:\n"
        "    task: [experiment=ladder, 'seed=1,2', train.max_updates=10]\n"
    )
    jobs = expected_jobs(root)
    assert [[o for o in j if o.startswith(("ladder", "seed"))] for j in jobs] == [
        ["ladder=step0_vaswani2017", "seed=1"],
        ["ladder=step0_vaswani2017", "seed=2"],
        ["ladder=step1_pre_ln", "seed=1"],
        ["ladder=step1_pre_ln", "seed=2"],
    ]
    comp = compare_sweeps([root], n_bootstrap=0)
    assert [(r.run_dir.name, r.reason) for r in comp.missing] == [("3", "job folder missing (never started)")]
    md = write_outputs(comp, tmp_path / "out")["markdown"].read_text()
    assert "(ladder=step1_pre_ln experiment=ladder seed=2): job folder missing (never started)" in md


def test_labels_from_config_values_when_no_choice_differs(tmp_path, corpus):
    refs = _refs(corpus)
    a = make_run(tmp_path / "s" / "0", corpus, "step1_pre_ln", 1, refs, bleu=1.0)
    b = make_run(tmp_path / "s" / "1", corpus, "step1_pre_ln", 1, refs, bleu=2.0)
    for run_dir, width in ((a, 32), (b, 64)):
        res = json.loads((run_dir / "results.json").read_text())
        res["config"]["model"]["d_model"] = width
        (run_dir / "results.json").write_text(json.dumps(res))
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0)
    assert [c.label for c in comp.configurations] == [
        "step1_pre_ln, model.d_model=32",
        "step1_pre_ln, model.d_model=64",
    ]


def test_outputs_markdown_csv_plots(sweep, tmp_path):
    comp = compare_sweeps([sweep], n_bootstrap=100)
    paths = write_outputs(comp, tmp_path / "out")
    md = paths["markdown"].read_text()
    assert "| step0_vaswani2017 (baseline) | 3/3 | 22.00 ± 2.00 |" in md
    assert "| step1_pre_ln | 3/4 | 32.00 ± 2.65 | +10.00 |" in md
    assert "## Runs without results (2)" in md and "/6`" in md and "/7`" in md
    assert "![bleu_bars](bleu_bars.png)" in md
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["label"] for r in rows] == ["step0_vaswani2017", "step1_pre_ln"]
    assert float(rows[1]["p_value"]) < 0.05 and rows[0]["p_value"] == ""
    assert float(rows[0]["bleu_std"]) == pytest.approx(2.0)
    runs = list(csv.DictReader(paths["runs_csv"].open()))
    assert sum(r["status"] == "missing" for r in runs) == 2 and sum(r["status"] == "ok" for r in runs) == 6
    for key in ("valid_curves", "bleu_bars"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[key].stat().st_size > 5000


def test_find_run_dirs_natural_order_and_nested(tmp_path, corpus):
    refs = _refs(corpus)
    for name in ("2", "10", "1"):
        make_run(tmp_path / "d" / "a" / name, corpus, "step0_vaswani2017", int(name), refs, bleu=1.0)
    (tmp_path / "d" / "a" / ".submitit").mkdir()
    assert [p.name for p in find_run_dirs(tmp_path / "d")] == ["1", "2", "10"]


def test_cli(sweep, tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "compare.py"), str(sweep), "--out", str(out), "--bootstrap", "50"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| step1_pre_ln | 3/4 |" in proc.stdout
    assert "2 run(s) without results" in proc.stderr
    assert {p.name for p in out.iterdir()} >= {
        "comparison.md",
        "comparison.csv",
        "runs.csv",
        "valid_curves.png",
        "bleu_bars.png",
    }
    bad = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "compare.py"), str(sweep), "--baseline", "zzz"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "matches no configuration" in bad.stderr


def test_neighbouring_rows_get_their_own_paired_bootstrap(tmp_path, corpus):
    """step0 -> step1 -> step2: each row is also tested against the row above (the switch it adds)."""
    refs = _refs(corpus)
    fracs = {"step0_vaswani2017": 0.9, "step1_pre_ln": 0.05, "step2_rmsnorm": 0.05}
    for n, (step, frac) in enumerate(fracs.items()):
        hyps = _degrade(refs, frac, 1)
        make_run(tmp_path / "s" / str(n), corpus, step, 1, hyps, bleu=10.0 * (n + 1))
    # step2's hypotheses equal step1's: no difference to the row above, p = 1
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=200)
    step0, step1, step2 = comp.rows
    assert step0["p_value_prev"] is None and step0["delta_prev_bleu"] is None
    assert step1["delta_prev_bleu"] == pytest.approx(10.0) and 0 < step1["p_value_prev"] < 0.05
    assert step2["delta_prev_bleu"] == pytest.approx(10.0) and step2["p_value_prev"] == 1.0
    assert step2["p_value"] == step1["p_value"] < 0.05  # against the baseline, as before
    # Holm over the family {step1 vs step0, step2 vs step0, step2 vs step1} (step1 vs the row above
    # is step1 vs step0, counted once): sorted p1 <= p1 <= 1 -> 3 p1, 3 p1, 1
    p1 = step1["p_value"]
    assert step1["p_value_holm"] == step1["p_value_prev_holm"] == pytest.approx(min(1.0, 3 * p1))
    assert step2["p_value_holm"] == pytest.approx(min(1.0, 3 * p1)) and step2["p_value_prev_holm"] == 1.0
    md = (write_outputs(comp, tmp_path / "out")["markdown"]).read_text()
    assert "| Δ prev | p prev Holm |" in md


def test_active_parameters_are_reported_beside_the_total(tmp_path, corpus):
    """A mixture of experts (active < total) shows both; a dense run, or one from before results.json
    had ``active_params``, counts its total, and a table of dense runs only reads as before."""
    refs = _refs(corpus)
    make_run(tmp_path / "s" / "0", corpus, "step0_vaswani2017", 1, _degrade(refs, 0.9, 1), bleu=10.0, params=2_165_760)
    make_run(
        tmp_path / "s" / "1",
        corpus,
        "step1_pre_ln",
        1,
        _degrade(refs, 0.05, 1),
        bleu=20.0,
        params=3_811_584,
        active_params=2_174_976,
    )
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0)
    assert [(r["params"], r["active_params"]) for r in comp.rows] == [(2_165_760, 2_165_760), (3_811_584, 2_174_976)]
    paths = write_outputs(comp, tmp_path / "out")
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [(r["params"], r["active_params"]) for r in rows] == [("2165760", "2165760"), ("3811584", "2174976")]
    md = paths["markdown"].read_text()
    assert (
        "| 2.17M | 2.00M |" in md and "| 3.81M (2.17M active) | 2.00M |" in md and "(active) those one token uses" in md
    )
    dense = compare_sweeps([tmp_path / "s"], n_bootstrap=0)
    dense.rows[1]["active_params"] = dense.rows[1]["params"]
    md = write_outputs(dense, tmp_path / "dense")["markdown"].read_text()
    assert "| 3.81M | 2.00M |" in md and " active)" not in md and "(active)" not in md


def test_machines_come_from_the_runs_results(tmp_path, corpus):
    refs = _refs(corpus)
    run = make_run(tmp_path / "s" / "0", corpus, "step0_vaswani2017", 1, refs, bleu=10.0)
    results = json.loads((run / "results.json").read_text())
    results.update(
        precision="fp32",
        device="cpu",
        hardware={
            "cpu": "Example CPU 9000",
            "cpu_count": 2,
            "cpu_capability": "AVX2",
            "torch_threads": 1,
            "torch": "2.13.0",
        },
    )
    (run / "results.json").write_text(json.dumps(results))
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0)
    assert comp.machines == [
        "Example CPU 9000 (2 cores, AVX2), torch 2.13.0 with 1 thread(s), fp32 precision, device cpu"
    ]
    md = (write_outputs(comp, tmp_path / "out")["markdown"]).read_text()
    assert "- trained on: Example CPU 9000" in md
    results["hardware"]["cpu_count"] = 1  # a run pinned to one core (taskset -c 0)
    assert describe_machine(results).startswith("Example CPU 9000 (1 core, AVX2), torch 2.13.0")


def test_speed_and_memory_are_not_averaged_over_different_machines(tmp_path, corpus):
    """Seeds of one configuration trained on a GPU and on a CPU core: their tokens/s do not average."""
    refs = _refs(corpus)
    cpu = {"cpu": "Example CPU 9000", "cpu_count": 1, "cpu_capability": "AVX2", "torch_threads": 1, "torch": "2.13.0"}
    for name, step, seed, hardware in [
        ("a1", "step0_vaswani2017", 1, cpu),
        ("a2", "step0_vaswani2017", 2, cpu),
        ("b1", "step1_pre_ln", 1, cpu),
        ("b2", "step1_pre_ln", 2, {**cpu, "gpu": "H200"}),
    ]:
        run = make_run(tmp_path / "s" / name, corpus, step, seed, refs, bleu=10.0 + seed)
        results = json.loads((run / "results.json").read_text())
        results.update(precision="fp32", device="cuda:0" if "gpu" in hardware else "cpu", hardware=hardware)
        (run / "results.json").write_text(json.dumps(results))
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0)
    one, two = comp.rows
    assert (one["machines"], one["train_tokens_per_s"], one["peak_memory_mb"]) == (1, 1500.0, 101.5)
    assert (two["machines"], two["train_tokens_per_s"], two["peak_memory_mb"]) == (2, None, None)
    md = write_outputs(comp, tmp_path / "out")["markdown"].read_text()
    assert "| 1.50K | 102 |" in md and "| mixed | mixed |" in md
    assert (
        "Train tok/s and Peak MB are shown only for a configuration whose runs trained on one machine and software"
        in md
    )
    runs = {r["run_dir"].rsplit("/", 1)[-1]: r for r in csv.DictReader((tmp_path / "out" / "runs.csv").open())}
    assert runs["b2"]["train_tokens_per_s"] == "2000.0" and runs["b2"]["machine"].startswith("H200 + Example CPU")
    assert runs["b1"]["machine"].startswith("Example CPU 9000 (1 core, AVX2)")


def test_holm_bonferroni_by_value():
    """Holm 1979 on p = (.01, .04, .03, .005): sorted .005 .01 .03 .04 -> 4x, 3x, 2x, 1x, made monotone."""
    from transformer.analysis.stats import holm_bonferroni

    adjusted = holm_bonferroni({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": None})
    assert adjusted["e"] is None
    assert {k: round(v, 10) for k, v in adjusted.items() if v is not None} == {
        "a": 0.03,
        "b": 0.06,
        "c": 0.06,
        "d": 0.02,
    }
    assert holm_bonferroni({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}  # capped at 1


def test_noise_floor_is_the_baselines_seed_spread(sweep, tmp_path):
    comp = compare_sweeps([sweep], n_bootstrap=0)
    # pooled over step0 [20, 22, 24] (variance 4) and step1 [30, 31, 35] (variance 7), 2 dof each:
    # sqrt((2 * 4 + 2 * 7) / 4) = sqrt(5.5); step1's crashed seed-4 run adds nothing
    assert comp.noise_floor == {
        "label": "step0_vaswani2017",
        "n_seeds": 3,
        "std": pytest.approx(2.0),
        "range": 4.0,
        "pooled_std": pytest.approx(5.5**0.5),
        "pooled_configs": 2,
    }
    step0, step1 = comp.rows
    assert step1["delta_bleu"] == pytest.approx(10.0) and step1["within_noise"] is False
    md = write_outputs(comp, tmp_path / "out")["markdown"].read_text()
    assert "Noise floor: step0_vaswani2017's test BLEU over 3 seeds varies by 4.00 (max − min; std 2.00)" in md
    assert "Pooled over the 2 configurations with two or more seeds, the seed std of test BLEU is 2.35." in md


def test_pooled_std_skips_single_seed_groups_and_weights_by_degrees_of_freedom():
    from transformer.analysis.stats import pooled_std

    assert pooled_std([[1.0], [2.0, 4.0], [0.0, 3.0, 6.0]]) == (pytest.approx(((1 * 2.0 + 2 * 9.0) / 3) ** 0.5), 2)
    assert pooled_std([[1.0], []]) == (None, 0)


def _set(run_dir: Path, **changes) -> None:
    """Change results.json: ``precision``/``torch`` at the top, dotted config keys inside ``config``."""
    res = json.loads((run_dir / "results.json").read_text())
    for key, value in changes.items():
        if key == "precision":
            res["precision"] = value
        elif key == "torch":
            res.setdefault("hardware", {})["torch"] = value
        else:
            node = res["config"]
            *parents, leaf = key.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    (run_dir / "results.json").write_text(json.dumps(res))


def _two_steps(tmp_path, corpus) -> tuple[Path, Path, Path]:
    refs = _refs(corpus)
    a = make_run(tmp_path / "s" / "a", corpus, "step0_vaswani2017", 1, refs, bleu=1.0)
    b = make_run(tmp_path / "s" / "b", corpus, "step0_vaswani2017", 2, refs, bleu=2.0)
    c = make_run(tmp_path / "s" / "c", corpus, "step1_pre_ln", 1, refs, bleu=3.0)
    for run in (a, b, c):
        _set(run, precision="fp32", torch="2.13.0+cpu", train__precision="fp32")
    return a, b, c


def test_runs_that_differ_beyond_the_switches_are_refused_naming_runs_and_fields(tmp_path, corpus):
    from transformer.analysis import MixedRunsError

    a, b, c = _two_steps(tmp_path, corpus)
    _set(c, precision="bf16", train__precision="auto", train__max_updates=20)
    _set(b, torch="2.14.0+cpu")
    with pytest.raises(MixedRunsError) as err:
        compare_sweeps([tmp_path / "s"], n_bootstrap=0)
    msg = str(err.value)
    assert "train.precision: fp32 (a, b); bf16 (c)" in msg
    assert "train.max_updates: 10 (a, b); 20 (c)" in msg
    assert "torch: 2.13.0+cpu (a, c); 2.14.0+cpu (b)" in msg
    assert "--allow-mixed" in msg
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0, allow_mixed=True)
    assert [m.key for m in comp.mixed] == ["torch", "train.max_updates", "train.precision"]
    rows = {r["label"]: r for r in comp.rows}
    assert rows["step1_pre_ln"]["mixed"] == "torch=2.13.0+cpu train.max_updates=20 train.precision=bf16"
    assert rows["step0_vaswani2017"]["mixed"] == "torch=2.13.0+cpu/2.14.0+cpu train.max_updates=10 train.precision=fp32"
    md = write_outputs(comp, tmp_path / "out")["markdown"].read_text()
    assert "| Differs in |" in md and "runs trained differently are compared (--allow-mixed)" in md
    cli = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "compare.py"),
            str(tmp_path / "s"),
            "--out",
            str(tmp_path / "cli"),
            "--bootstrap",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        cli.returncode == 2
        and cli.stderr.startswith("error: the runs of this table differ")
        and "Traceback" not in cli.stderr
    )


def test_a_plugin_run_is_compared_with_built_in_runs_and_its_code_tells_configurations_apart(tmp_path, corpus):
    a, b, c = _two_steps(tmp_path, corpus)
    _set(c, plugin_files={"reglu/__init__.py": "ab12"}, plugins=["/home/me/my_ideas/reglu"], model__ffn__name="reglu")
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0)  # the baseline records no plugin files
    assert comp.mixed == [] and [r["n_runs"] for r in comp.rows] == [2, 1]
    d = make_run(tmp_path / "s" / "d", corpus, "step1_pre_ln", 2, _refs(corpus), bleu=4.0)
    _set(d, precision="fp32", torch="2.13.0+cpu", train__precision="fp32", plugin_files={"reglu/__init__.py": "cd34"})
    _set(d, model__ffn__name="reglu")
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0)  # the plugin's code changed: not a second seed
    assert [r["n_runs"] for r in comp.rows] == [2, 1, 1] and comp.mixed == []


def test_auto_precision_is_compared_as_resolved_and_new_fields_take_their_defaults(tmp_path, corpus):
    a, b, c = _two_steps(tmp_path, corpus)
    _set(a, train__precision="auto")  # resolved fp32 on its machine: the same recipe as b's explicit fp32
    res = json.loads((b / "results.json").read_text())
    res["config"]["train"]["ema_decay"] = 0.0  # a field a's config (older) does not have, at its default
    (b / "results.json").write_text(json.dumps(res))
    comp = compare_sweeps([tmp_path / "s"], n_bootstrap=0)
    assert [r["n_runs"] for r in comp.rows] == [2, 1] and comp.mixed == []
    _set(b, train__ema_decay=0.5)  # not the default: a different recipe
    with pytest.raises(ValueError, match=r"train.ema_decay: 0.0 \(a, c\); 0.5 \(b\)"):
        compare_sweeps([tmp_path / "s"], n_bootstrap=0)


def test_max_tokens_may_follow_the_architecture_only(tmp_path, corpus):
    a, b, c = _two_steps(tmp_path, corpus)
    _set(c, model__arch="decoder_only", train__max_tokens=8192)
    for run in (a, b):
        _set(run, train__max_tokens=4096)
    assert compare_sweeps([tmp_path / "s"], n_bootstrap=0).mixed == []  # the decoder-only step doubles it
    _set(b, train__max_tokens=2048)  # same architecture as a, other batch: refused
    with pytest.raises(ValueError, match=r"train.max_tokens: 4096 \(a\); 2048 \(b\); 8192 \(c\)"):
        compare_sweeps([tmp_path / "s"], n_bootstrap=0)


def test_a_config_recorded_before_a_field_existed_groups_with_its_default(tmp_path):
    """A run recorded without the attention fields added since (qk_norm, attention_window, rope_scaling, ...)
    is the same configuration as one that records their defaults."""
    from transformer.config import identity_key

    new = _config(tmp_path, "step0_vaswani2017", 1)
    new["model"].update(qk_norm="none", attention_window=None, attention_window_pattern=0, kv_lora_rank=None)
    new["model"]["position"] = {"rope_scaling": {"rope_type": "default", "factor": 1.0}}
    old = _config(tmp_path, "step0_vaswani2017", 2)
    assert identity_key(new) == identity_key(old)
    new["model"]["qk_norm"] = "rmsnorm"
    assert identity_key(new) != identity_key(old)


def test_p_values_from_the_references_the_run_folders_store_without_the_data(sweep, corpus):
    with_data = compare_sweeps([sweep], n_bootstrap=100)
    references = (corpus / "test.de").read_text(encoding="utf-8")
    for hyps in sweep.glob("*/hyps/test.txt"):
        (hyps.parent / "test.ref").write_text(references, encoding="utf-8")  # as scripts/train.py stores them
    shutil.rmtree(corpus)  # the folders travel; the data stays behind
    alone = compare_sweeps([sweep], n_bootstrap=100)
    assert alone.rows[1]["p_value"] is not None and not alone.unreferenced
    assert [r["p_value"] for r in alone.rows] == [r["p_value"] for r in with_data.rows]
    assert "No p-values" not in to_markdown(alone)


def test_references_found_nowhere_are_said_at_the_top_of_the_comparison(sweep, corpus, tmp_path):
    shutil.rmtree(corpus)
    comp = compare_sweeps([sweep], n_bootstrap=50)
    assert comp.rows[1]["p_value"] is None and comp.unreferenced
    lines = to_markdown(comp).splitlines()
    assert lines[2].startswith("**No p-values where the references are missing**: the references of `test`")
    assert "TRANSFORMER_DATA_DIR" in lines[2] and "data.download" not in "\n".join(lines)
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "compare.py"), str(sweep), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2] == lines[2]  # the top of what it prints, as of comparison.md
    assert (tmp_path / "out" / "comparison.md").read_text(encoding="utf-8").splitlines()[2] == lines[2]
    assert "warning: no p-values where the references are missing" in out.stderr


def _record(sweep: Path, num: int, folder: str, overrides: list[str], state: str, error: str | None = None) -> None:
    """A line of the sweep's jobs.jsonl as scripts/train.py appends it when a job ends."""
    line = {"num": num, "folder": folder, "overrides": overrides, "state": state, "error": error, "sweep": None}
    with (sweep / "jobs.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def test_every_job_of_a_named_sweep_is_counted_with_its_state(tmp_path, corpus):
    """Folders named ``<step>_seed<seed>`` (experiment=ladder): a job refused at validation and one
    that failed at its first update leave no folder, one crashed, one folder was deleted, one job
    never started; each is listed with its state and line, and its row counts it (2/3)."""
    root = tmp_path / "sweep"
    refs = _refs(corpus)
    steps = {"step0_vaswani2017": 0.5, "step1_pre_ln": 0.1}
    for step, frac in steps.items():
        for seed in (1, 2, 3):
            job = [f"ladder={step}", f"seed={seed}"]
            num = 3 * list(steps).index(step) + seed - 1
            folder = f"{step}_seed{seed}"
            if (step, seed) == ("step1_pre_ln", 2):
                make_run(root / folder, corpus, step, seed, None, finished=False)
                (root / folder / "train.log").write_text("update 5\nRuntimeError: boom\n")
                _record(root, num, folder, job, "crashed", "RuntimeError: boom")
            elif (step, seed) == ("step1_pre_ln", 3):
                _record(root, num, folder, job, "refused", "invalid configuration: model.n_heads=3 ...")
            elif (step, seed) != ("step0_vaswani2017", 3):
                make_run(root / folder, corpus, step, seed, _degrade(refs, frac, seed), bleu=20.0 + seed)
                _record(root, num, folder, job, "finished")
            else:  # finished, then its folder was deleted
                _record(root, num, folder, job, "finished")
    (root / "multirun.yaml").write_text(
        "hydra:\n"
        "  sweep: {dir: sweep, subdir: '${hydra:runtime.choices.ladder}_seed${seed}'}\n"
        "  sweeper:\n"
        "    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    params: {seed: '1,2,3', ladder: 'step0_vaswani2017,step1_pre_ln,step2_rmsnorm'}\n"
        "  overrides:\n"
        "    task: []\n"
    )
    comp = compare_sweeps([root], n_bootstrap=0)
    assert [(r["label"], r["n_runs"], r["n_missing"]) for r in comp.rows] == [
        ("step0_vaswani2017", 2, 1),
        ("step1_pre_ln", 1, 2),
    ]
    reasons = {r.run_dir.name: r.reason for r in comp.missing}
    assert reasons["step0_vaswani2017_seed3"] == "its folder is gone (the job finished: deleted or moved since)"
    assert reasons["step1_pre_ln_seed3"] == "refused: invalid configuration: model.n_heads=3 ..."
    assert reasons["step1_pre_ln_seed2"].startswith(
        "crashed: RuntimeError: boom; no results.json (last logged update 5)"
    )
    never = [r for r in comp.missing if "never started" in (r.reason or "")]
    assert sorted(" ".join(sorted(r.overrides)) for r in never) == [f"ladder=step2_rmsnorm seed={s}" for s in (1, 2, 3)]
    md = to_markdown(comp)
    assert "| step0_vaswani2017 (baseline) | 2/3 |" in md and "| step1_pre_ln | 1/3 |" in md
    assert f"## Runs without results ({len(comp.missing)})" in md and len(comp.missing) == 6
