"""The fake-CUDA dry run: the training step, validation, checkpoints and decoding as they run on
``train.device=cuda``, on a CPU-only machine (:mod:`tests.fake_cuda`).

Every model preset in fp32, bf16 (autocast) and fp16 (autocast and the GradScaler), and switch
combinations until every option of every group has run (:mod:`tests.fake_cuda.cases`), each one
update of the project's own ``Trainer.train_step`` on fake ``cuda:0`` tensors: any operator that
meets a ``cuda:0`` tensor and a non-scalar CPU tensor fails the case with torch's
``FakeTensorDeviceMismatchError``; afterwards every parameter, gradient, buffer, table, optimizer
state, moving average and GradScaler tensor must be on ``cuda:0``; the update's batches are copied
there from pinned memory without the host waiting (prefetched as ``train.prefetch=auto`` does on
CUDA). One child process runs them all (~40 s on two busy cores); it needs a C++ compiler for the
stand-in CUDA backend (``tests/fake_cuda/fake_cuda_device.cpp``) and is skipped, saying so, without
one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.fake_cuda.build import ShimUnavailable, build_shim
from tests.fake_cuda.cases import DECODING_GROUPS, PRECISIONS, Case, cases, coverage, decoding_options, groups

INJECTED = "inject:cpu_mask"
UPDATE_SYNCS_ALLOWED = {
    # a mixture of experts' eager loop over its experts, where CUDA has no grouped_mm kernel (fp32,
    # fp16): each expert's row count is read (transformer/modules/moe.py; compiled, it is the dense dispatch)
    ("transformer/modules/moe.py", "for e, rows in enumerate(x.split(counts.tolist())):"),
}
"""Host syncs a training update that neither logs, validates nor saves may still make: (file, source line)."""
DECODE_SYNCS_PER_STEP = {"greedy": 8.0, "beam": 8.5}
"""The most host reads per decoding step (per generated token) any decoding case makes, all of them
counted, per-search ones included (beam 2, two steps: those weigh half a read each). Before the searches
read one packed status per step: greedy 16, beam 33.5. What remains above the searches' own reads is the
model's: a mixture of experts' eager expert loop (``transformer/modules/moe.py``, as in training) in
every step, and the decoder-only model's padding check once per search."""
SEARCH_READS = {"greedy": 1, "beam": 2}
"""The searches' own host reads (lines of ``transformer/generation``), beyond one per step: greedy
reads every finished row once at the end; beam search reads the longest ``max_len`` at the start
and the finished hypotheses at the end."""


@pytest.fixture(scope="module")
def shim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in CUDA backend, compiled once per torch build (kept in pytest's cache)."""
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    folder = cache.mkdir("fake_cuda") if cache is not None else tmp_path_factory.mktemp("fake_cuda")
    try:
        return build_shim(Path(folder))
    except ShimUnavailable as err:
        pytest.skip(f"fake-CUDA dry run unavailable: {err}")


@pytest.fixture(scope="module")
def all_cases() -> list[Case]:
    return cases()


@pytest.fixture(scope="module")
def results(shim: Path, all_cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case, plus the cheapest decoder-only preset with a CPU-made attention mask injected
    (:func:`tests.fake_cuda.dry_run.inject_cpu_mask`), in one child process."""
    plan = [c.as_dict() for c in all_cases]
    injected = dict(
        next(p for p in plan if p["name"] == "preset:llama_style"),
        name=INJECTED,
        inject="cpu_mask",
        precisions=["bf16"],
        fit=[],
        resume=[],
        decoding=[],
        compose=None,
    )
    return run_plan([*plan, injected], tmp_path_factory.mktemp("fake_cuda_run"), shim)


DATA_PATH_CASES = {"preset:transformer_2017_base": ("fp32", 3), "preset:llama_style": ("bf16", 2)}
"""The cheapest encoder-decoder and decoder-only cases whose training batches' copies
:func:`test_training_batches_reach_the_gpu_pinned_without_the_host_waiting` counts: case ->
(precision, training tensors of a batch: the encoder-decoder's source, shifted target and target;
the decoder-only model's tokens and target)."""
PREFETCH_THREAD = "batch-prefetch"
"""The name of the trainer's prefetching thread (:class:`transformer.data.prefetch.Prefetcher`)."""


@pytest.fixture(scope="module")
def data_path_results(shim: Path, all_cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``Trainer.train_step`` of each of :data:`DATA_PATH_CASES`, alone (no fit, no decoding)."""
    plan = [
        {**c.as_dict(), "precisions": [DATA_PATH_CASES[c.name][0]], "fit": [], "resume": [], "decoding": []}
        for c in all_cases
        if c.name in DATA_PATH_CASES
    ]
    assert len(plan) == len(DATA_PATH_CASES), [c.name for c in all_cases]
    return run_plan(plan, tmp_path_factory.mktemp("fake_cuda_data_path"), shim)


def run_plan(plan: list[dict[str, Any]], folder: Path, shim: Path, launches: dict | None = None) -> dict[str, Any]:
    """Run the cases (and ``launches``: name -> :func:`tests.fake_cuda.dry_run.launch_counts`
    arguments) in ``python -m tests.fake_cuda.runner``; returns its results by case name (by
    launch-count name when ``launches`` is given)."""
    (folder / "plan.json").write_text(json.dumps({"cases": plan, "launches": launches or {}}), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fake_cuda.runner",
            str(shim),
            str(folder / "plan.json"),
            str(folder / "results.json"),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"the dry-run process failed:\n{done.stderr[-5000:]}"
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))["launches" if launches else "cases"]


def failures(results: dict[str, Any], names: list[str]) -> list[str]:
    """One line per failed run of the named cases: case, precision, error or problems."""
    out = []
    for name in names:
        case = results[name]
        if "error" in case:
            out.append(f"{name}: {case['error']}")
        for precision, run in case.get("runs", {}).items():
            if not run["ok"]:
                out.append(f"{name} [{precision}]: {run['error'] or ''} {'; '.join(run['problems'])}".strip())
    return out


# ----------------------------------------------------------------------------- the cases


def test_cases_cover_every_option_of_every_group(all_cases: list[Case]) -> None:
    covered = coverage(all_cases)
    missing = {g.name: sorted(set(g.options) - covered[g.name]) for g in groups() if set(g.options) - covered[g.name]}
    assert not missing, f"options no case of the dry run covers: {missing}"
    presets = {p.stem for p in (REPO_ROOT / "configs" / "model").glob("*.yaml")}
    in_cases = {n for c in all_cases if c.name.startswith("preset:") for n in (c.name.split(":", 1)[1], *c.same)}
    assert in_cases == presets
    for case in all_cases:
        if case.name.startswith("preset:"):
            assert case.precisions == PRECISIONS, case.name
    # every precision meets both families, a mixture of experts, MLA and sliding windows
    for key, option in (
        ("model.arch", "encoder_decoder"),
        ("model.arch", "decoder_only"),
        ("FFNS", "moe"),
        ("ATTENTION_KINDS", "mla"),
        ("model.attention_window", "local"),
    ):
        ran = {p for c in all_cases if c.covers.get(key) == option for p in c.precisions}
        assert ran == set(PRECISIONS), (key, option, ran)
    # decoding runs with every option of the groups that change it
    every = set().union(*map(decoding_options, all_cases))
    decoded = set().union(*(decoding_options(c) for c in all_cases if c.decoding))
    assert decoded == every and {g for g, _ in every} == set(DECODING_GROUPS), every - decoded
    for step in ("fit", "resume"):
        assert {c.covers["model.arch"] for c in all_cases if getattr(c, step)} == {"encoder_decoder", "decoder_only"}


# ----------------------------------------------------------------------------- the dry run


def test_training_step_on_the_gpu_keeps_every_tensor_there(results: dict[str, Any], all_cases: list[Case]) -> None:
    """One update per case and precision: forward under autocast, the fused label-smoothed loss,
    backward (GradScaler under fp16), clipping, the fused optimizer step, the schedule; then
    parameters, gradients (fp32), buffers, tables, optimizer and GradScaler state all on ``cuda:0``."""
    bad = failures(results, [c.name for c in all_cases])
    assert not bad, "the dry run on cuda:0 failed:\n" + "\n".join(bad)
    for case in all_cases:
        assert set(results[case.name]["runs"]) == set(case.precisions)


def test_fit_checkpoints_and_decoding_on_the_gpu(results: dict[str, Any], all_cases: list[Case]) -> None:
    """``Trainer.fit`` for one update: validation (loss, beam-search BLEU; the moving average swapped
    in) and ``checkpoint_last`` saved from the GPU, its GPU tensors recorded as ``cuda:0`` as a GPU
    writes them; read back with ``map_location="cpu"`` and resumed on the GPU for one more update;
    greedy and beam search through ``translate_sentences``, a hypothesis for every sentence."""
    for case in all_cases:
        runs = results[case.name]["runs"]
        for precision in case.fit:
            run = runs[precision]
            assert {"train", "valid"} <= set(run["logged"]) and "bleu" in run["logged"]["valid"], run
            assert run["saved_on_cuda"] > 0 and run["saved_tensors"] > run["saved_on_cuda"], run
        for precision in case.resume:
            run = runs[precision]
            assert "CUDA device" in run["without_map_location"], run  # the file really says cuda:0
            assert "train_step after resume" in run["resume_syncs"], run
        for precision in case.decoding:
            assert {"greedy", "beam"} <= set(runs[precision]["ops"]), (case.name, precision)


def test_a_cpu_made_mask_in_the_forward_pass_fails_the_dry_run(results: dict[str, Any]) -> None:
    """The dry run finds the bug it exists for: an attention mask made with ``torch.ones(...)`` and no
    ``device=`` in every forward pass stops the first operator that meets it."""
    run = results[INJECTED]["runs"]["bf16"]
    assert not run["ok"]
    assert run["error"].startswith("FakeTensorDeviceMismatchError"), run["error"]
    assert "cuda:0 and cpu" in run["error"], run["error"]


def parse_sync(key: str) -> tuple[str, str, str]:
    """``(kind, file, source line)`` of a key of :func:`tests.fake_cuda.dry_run.host_syncs`
    (``"kind at file:line function: source line"``)."""
    kind, rest = key.split(" at ", 1)
    where, text = rest.split(": ", 1) if ": " in rest else (rest, "")
    return kind, where.split(":", 1)[0], text


def test_a_training_update_reads_nothing_on_the_host(results: dict[str, Any], all_cases: list[Case]) -> None:
    """Every case (every preset among them) in every precision: one ``Trainer.train_step`` that
    neither logs, validates nor saves (and the one after a resume) makes no host sync, but for
    :data:`UPDATE_SYNCS_ALLOWED`; the losses, token counts and finiteness state stay on the device."""
    bad = []
    for case in all_cases:
        for precision, run in results[case.name]["runs"].items():
            phases = {**run["syncs"], **run.get("resume_syncs", {})}
            for phase in ("train_step", "train_step after resume"):
                for key, count in phases.get(phase, {}).items():
                    if parse_sync(key)[1:] not in UPDATE_SYNCS_ALLOWED:
                        bad.append(f"{case.name} [{precision}] {phase}: {count} x {key}")
    assert not bad, "host syncs in a training update:\n" + "\n".join(bad)


def test_decoding_host_syncs_per_generated_token_are_reported(results: dict[str, Any], all_cases: list[Case]) -> None:
    """Greedy and beam search on the fake GPU, for every decoding case: the searches read the host
    once per step (one packed status read) plus :data:`SEARCH_READS` per search, and
    all host reads per ``decode_step`` call stay within :data:`DECODE_SYNCS_PER_STEP` (the table,
    with the reads made between the first and the last step per step, is the failure message)."""
    rows, over = [], []
    for case in all_cases:
        for precision in case.decoding:
            run = results[case.name]["runs"][precision]
            for strategy, ceiling in DECODE_SYNCS_PER_STEP.items():
                steps = run["decode_steps"][strategy]
                assert steps > 1, (case.name, precision, strategy)
                syncs = run["syncs"].get(strategy, {})
                per_step = sum(syncs.values()) / steps
                own = sum(n for key, n in syncs.items() if parse_sync(key)[1].startswith("transformer/generation/"))
                loop = run["decode_syncs"][strategy]["per_step"]
                rows.append(
                    f"{case.name} [{precision}] {strategy}: {per_step:.1f} per step over {steps} steps "
                    f"({loop:.1f} per step between the first and the last; the search's own {own})"
                )
                if per_step > ceiling or own > steps + SEARCH_READS[strategy]:
                    over.append(rows[-1])
    assert rows and not over, "host syncs per decoding step above the ceiling:\n" + "\n".join(rows)


def data_path_problems(run: dict[str, Any], phases: tuple[str, ...]) -> list[str]:
    """What the training batches' way to the GPU breaks in ``phases`` of one run: a copy of a batch
    tensor the host waits for or from pageable memory, a phase with no batch copy, prefetching off,
    pinning outside the prefetching thread."""
    bad = []
    for phase in phases:
        copies = run["copies"].get(phase, {})
        if copies.get("blocking", 0) or copies.get("pageable", 0) or not copies.get("async", 0):
            sites = {k: n for k, n in run["copy_sites"].get(phase, {}).items() if k.startswith("batch ")}
            bad.append(f"{phase}: {copies} ({sites})")
    if run["prefetch"] != 4 or set(run["pinned_by"]) != {PREFETCH_THREAD}:
        bad.append(f"train.prefetch={run['prefetch']}, pinned by threads {run['pinned_by']}")
    return bad


def test_training_batches_reach_the_gpu_pinned_without_the_host_waiting(data_path_results: dict[str, Any]) -> None:
    """On CUDA, ``train.prefetch=auto`` collates and pins the batches ahead in the prefetching thread
    (stopped when the batches are closed) and the update copies them ``non_blocking``: no copy of a
    training batch's tensors that the host waits for, none from pageable memory."""
    bad = failures(data_path_results, list(DATA_PATH_CASES))
    for name, (precision, tensors) in DATA_PATH_CASES.items():
        run = data_path_results[name]["runs"][precision]
        bad += [f"{name} [{precision}] {b}" for b in data_path_problems(run, ("train_step",))]
        copied = sum(n for k, n in run["copy_sites"].get("train_step", {}).items() if k.startswith("batch "))
        if copied != tensors:  # every training tensor of the update's one batch counted, once
            bad.append(f"{name} [{precision}]: {copied} batch copies, not {tensors}")
    assert not bad, "training batches copied to the GPU blocking or from pageable memory:\n" + "\n".join(bad)


def test_every_update_copies_its_batches_pinned_without_the_host_waiting(
    results: dict[str, Any], all_cases: list[Case]
) -> None:
    """Every case and precision: the update of ``train_step``, of ``fit`` (its validation batches,
    phase ``validate``, are not training batches) and the one after a resume copy their batches
    from pinned memory, ``non_blocking``, the batches pinned in the prefetching thread."""
    bad = []
    for case in all_cases:
        for precision, run in results[case.name]["runs"].items():
            phases = ("fit",) if precision in case.fit else ("train_step",)
            phases += ("train_step after resume",) if precision in case.resume else ()
            bad += [f"{case.name} [{precision}] {b}" for b in data_path_problems(run, phases)]
    assert not bad, "training batches copied to the GPU blocking or from pageable memory:\n" + "\n".join(bad)


LAUNCH_BUDGET = {"loss": 150}
"""The most device operators the output layer fused with the loss may dispatch in one quiet eager
update of the base model at 16k target tokens (1,144 when its chunks followed Liger-Kernel's rule:
32 chunks of ~36 operators)."""


@pytest.fixture(scope="module")
def launch_results(shim: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """:func:`tests.fake_cuda.dry_run.launch_counts` of ``transformer_2017_base`` in bf16 at 16k target
    tokens and a 32k vocabulary (eager), and of the same with ``train.compile=auto``."""
    base = {"preset": "transformer_2017_base", "precision": "bf16", "target_tokens": 16384, "vocab": 32000}
    launches = {"eager": base, "auto": {**base, "compile_step": "auto"}}
    return run_plan([], tmp_path_factory.mktemp("fake_cuda_launches"), shim, launches)


def test_compile_auto_compiles_the_step_on_cuda(launch_results: dict[str, Any]) -> None:
    assert launch_results["auto"]["error"] is None and launch_results["auto"]["compiled"] is True
    assert launch_results["eager"]["compiled"] is False


def test_an_eager_update_launches_few_kernels_in_its_loss_and_optimizer(launch_results: dict[str, Any]) -> None:
    """The launch budget of an eager update on the accelerator's path (``transformer_2017_base``, bf16,
    16k target tokens, 32k vocabulary): the fused output layer and loss in a few large chunks, and
    after the backward pass the gradient norm and one fused AdamW kernel, with no pass dividing or
    clipping the gradients (``train.clip_norm=0``: the loss was scaled before the backward pass)."""
    eager = launch_results["eager"]
    assert eager["error"] is None, eager["error"]
    phases = {phase: sum(ops.values()) for phase, ops in eager["phases"].items()}
    print("device operators per phase:", phases, eager["phases"]["optimizer"])  # with -s
    assert phases["loss"] <= LAUNCH_BUDGET["loss"], eager["phases"]["loss"]
    optimizer = eager["phases"]["optimizer"]
    assert sum(n for op, n in optimizer.items() if op.startswith("_fused_adam")) == 1, optimizer
    assert not {"_foreach_div_", "_foreach_mul_", "div_", "mul_"} & set(optimizer), optimizer
    assert phases["optimizer"] <= 40, optimizer
    assert all(phases[p] > 0 for p in ("forward", "backward")), phases
