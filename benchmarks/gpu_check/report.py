"""The record of the GPU check (``python -m benchmarks.gpu_check``): ``gpu_check.json`` and ``gpu_check.md``, rewritten
(atomically, :func:`transformer.io.atomic_write_text`) whenever a section changes, the sections'
status and checks, the time budget, and the summary of a ``results_gpu.sh`` study
(``--study-summary``). The ``realistic`` section's tables are drawn by ``render.py``."""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer.io import atomic_write_text

from .render import render_realistic, render_trainer

REPO = Path(__file__).resolve().parents[2]
SECTIONS = (  # the order they run in: what a GPU session is for first, the parity checks done before last
    "environment",
    "trainer",
    "training_compile",
    "realistic",
    "training",
    "decoding",
    "sdpa",
    "throughput",
)


class Stopped(Exception):
    """SIGTERM arrived (a time cap): the section in progress is recorded, the rest do not run."""


class OutOfTime(Exception):
    """The next piece of work would start past ``--budget-s``."""


class Budget:
    """Seconds left of ``--budget-s`` (0 = no limit), and what was skipped for want of them.

    Args:
        seconds: the budget (0: no limit).
        skipped: the list each refusal's message is added to (default: a list of its own; a
            section's budget passes the check's, so that the report lists every skip in one place).
    """

    def __init__(self, seconds: float, skipped: list[str] | None = None) -> None:
        self.start, self.seconds = time.time(), seconds
        self.skipped = [] if skipped is None else skipped

    def left(self) -> float:
        """Seconds left (infinite without a budget)."""
        return math.inf if self.seconds <= 0 else self.seconds - (time.time() - self.start)

    def need(self, seconds: float, what: str) -> None:
        """Raise :class:`OutOfTime` when fewer than ``seconds`` are left for ``what``."""
        if self.left() < seconds:
            message = (
                f"{what}: skipped, {max(self.left(), 0):.0f} s of the {self.seconds:.0f} s budget "
                f"left, ~{seconds:.0f} s needed"
            )
            self.skipped.append(message)
            raise OutOfTime(message)


class Report:
    """``gpu_check.json`` + ``gpu_check.md`` in ``out``, rewritten whenever a section changes."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"meta": meta, "sections": {}}

    def write(self) -> None:
        """Write both files (atomically: a reader never sees half a file)."""
        self.data["meta"]["written"] = datetime.datetime.now().isoformat(timespec="seconds")
        atomic_write_text(self.out / "gpu_check.json", json.dumps(self.data, indent=1, default=str) + "\n")
        atomic_write_text(self.out / "gpu_check.md", markdown(self.data))

    def start(self, name: str) -> dict[str, Any]:
        """A new section record, status ``running`` (what a killed process leaves)."""
        sec = {
            "status": "running",
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "checks": [],
            "results": {},
            "notes": [],
        }
        self.data["sections"][name] = sec
        self.write()
        return sec

    def skip(self, name: str, reason: str) -> None:
        """Record ``name`` as skipped with ``reason``."""
        self.data["sections"][name] = {"status": "skipped", "reason": reason, "checks": [], "results": {}, "notes": []}
        self.write()

    def run(self, name: str, fn: Callable[[dict[str, Any]], None]) -> None:
        """Run section ``fn(sec)``; it fills ``sec["results"]`` / ``sec["checks"]`` and may call
        :meth:`write` as it goes. Status: ``passed`` (every check held), ``failed`` (a check did
        not hold, or it raised: ``error`` and ``traceback``), ``skipped`` (it raised
        :class:`OutOfTime`: nothing of it fitted the time budget; ``reason``, results kept)."""
        sec = self.start(name)
        t = time.time()
        try:
            fn(sec)
            bad = [c["name"] for c in sec["checks"] if not c["passed"]]
            sec["status"] = "failed" if bad else "passed"
            if bad:
                sec["error"] = "checks that did not hold: " + "; ".join(bad)
        except Stopped as err:
            sec.update(status="failed", error=str(err))
            raise
        except OutOfTime as err:
            sec.update(status="skipped", reason=f"time budget: {err}")
        except Exception as err:  # one section failing must not stop the others
            sec.update(
                status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(limit=12)[-4000:]
            )
            print(f"[{name}] failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        finally:
            sec["seconds"] = round(time.time() - t, 1)
            self.write()
        print(f"[{name}] {sec['status']} in {sec['seconds']:.0f} s", file=sys.stderr, flush=True)


def check(sec: dict[str, Any], name: str, passed: bool, detail: str = "") -> bool:
    """Append one named check to a section."""
    sec["checks"].append({"name": name, "passed": bool(passed), "detail": detail})
    return bool(passed)


def git_commit() -> str:
    """The short commit of the working tree ('+ local changes' when it differs), or '?'."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (commit or "?") + (" + local changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


# ----------------------------------------------------------------------------- study summary


def study_summary(runs_dir: Path, out: Path, device_name: str, note: str) -> dict[str, Any]:
    """Per run folder of a ``results_gpu.sh`` study: updates reached, last tokens/s, validation and
    test BLEU (``results.json`` when the run finished); written to ``out/study_progress.{json,md}``.

    A finished run's device is the one its ``results.json`` records (``cuda:0``, with the GPU's name),
    so a summary written on another machine names where the runs trained; ``device_name`` (this
    machine's device) titles the summary only when no finished run records a GPU."""
    rows, finished = [], []
    for metrics in sorted(runs_dir.glob("**/metrics.jsonl")):
        run = metrics.parent
        recs = []
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        train = [x for x in recs if x.get("split") == "train"]
        valid = [x for x in recs if x.get("split") == "valid"]
        res = run / "results.json"
        done = json.loads(res.read_text()) if res.is_file() else None
        if done is not None:
            finished.append(done)
        cfg_file = run / "config.yaml"
        cfg = OmegaConf.load(cfg_file) if cfg_file.is_file() else None
        rows.append(
            {
                "run": str(run.relative_to(runs_dir)),
                "updates": train[-1]["update"] if train else 0,
                "precision": (done or {}).get("precision") or (cfg.train.precision if cfg is not None else None),
                "device": _run_device(done) or (cfg.train.device if cfg is not None else None),
                "max_updates": cfg.train.max_updates if cfg is not None else None,
                "tokens_per_s": train[-1].get("tokens_per_s") if train else None,
                "last_valid": {k: valid[-1].get(k) for k in ("update", "loss", "bleu")} if valid else None,
                "finished": done is not None,
                "test_bleu": done.get("bleu") if done else None,
                "wall_time_s": done.get("wall_time_s") if done else None,
            }
        )
    gpus = sorted({d["hardware"]["gpu"] for d in finished if (d.get("hardware") or {}).get("gpu")})
    device_name = " + ".join(gpus) or device_name
    res = {
        "device_name": device_name,
        "note": note,
        "runs_dir": str(runs_dir),
        "runs": rows,
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "study_progress.json", json.dumps(res, indent=1) + "\n")
    lines = [
        f"# results_gpu.sh study on {device_name}: progress",
        "",
        f"{note}  ",
        f"Date {res['date']}, commit "
        f"`{res['commit']}`; runs in `{runs_dir}`. Precision as each run's config says (the ladder and the Wu "
        "recipe pin fp32, so that these runs compare with the CPU runs).",
        "",
        "| run | device | precision | updates / budget | train tok/s (last window) | last valid (update: loss / BLEU) | "
        "finished | test BLEU |",
        "|---|---|---|---:|---:|---|---|---:|",
    ]
    for x in rows:
        v = x["last_valid"]
        vs = f"{v['update']}: {v['loss']:.3f} / {_f(v['bleu'], '{:.2f}') or '-'}" if v else ""
        lines.append(
            f"| {x['run']} | {x['device']} | {x['precision']} | {x['updates']} / {x['max_updates']} | "
            f"{x['tokens_per_s'] or 0:,.0f} | {vs} | "
            f"{'yes' if x['finished'] else 'no'} | {_f(x['test_bleu'], '{:.2f}')} |"
        )
    atomic_write_text(out / "study_progress.md", "\n".join(lines) + "\n")
    return res


def _run_device(done: dict[str, Any] | None) -> str | None:
    """``cuda:0 (NVIDIA H200)`` / ``cpu`` from a finished run's ``results.json``; None when unfinished."""
    if not done or not done.get("device"):
        return None
    gpu = (done.get("hardware") or {}).get("gpu")
    return f"{done['device']} ({gpu})" if gpu and str(done["device"]).startswith("cuda") else str(done["device"])


# ----------------------------------------------------------------------------- markdown


def _f(x: Any, fmt: str = "{:.4f}") -> str:
    return "" if x is None else fmt.format(x)


def markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: a status table, then one part per section."""
    m = data["meta"]
    gpu = m["device"] == "cuda"
    budget = f"budget {float(m['budget_s']):.0f} s" if m["budget_s"] else "no time budget"
    lines = [
        f"# GPU check: {m['device_name']}",
        "",
        (
            f"**GPU results** ({m['device_name']}, `--device cuda{' --quick' if m['quick'] else ''}`)."
            if gpu
            else f"**CPU smoke run, not GPU results** (`--device cpu{' --quick' if m['quick'] else ''}` on {m['device_name']})."
        ),
        "",
        f"Command: `{m['command']}`  ",
        f"Date: {m['date']}; commit `{m['commit']}`; torch {m['torch']}"
        f"{', CUDA ' + str(m['cuda']) if m.get('cuda') else ''}; "
        f"{budget}; written {m.get('written', '')}",
        "",
        "| section | status | seconds | note |",
        "|---|---|---:|---|",
    ]
    for name in SECTIONS:
        s = data["sections"].get(name)
        if s is None:
            lines.append(f"| {name} | not run | | |")
            continue
        note = s.get("error") or s.get("reason") or "; ".join(s.get("notes", [])) or ""
        if s["status"] == "running":
            note = "incomplete: the process stopped during this section"
        lines.append(f"| {name} | {s['status']} | {_f(s.get('seconds'), '{:.0f}')} | {note.replace('|', '/')[:300]} |")
    skipped = data.get("skipped_for_time") or []
    if skipped:
        lines += [
            "",
            f"Skipped for the time budget ({len(skipped)}; a second call with `--skip` of what ran does them):",
            "",
        ]
        lines += [f"- {x}" for x in skipped]
    for name in SECTIONS:
        s = data["sections"].get(name)
        if not s or (s["status"] == "skipped" and not s["results"]):
            continue
        lines += ["", f"## {name}", ""]
        if s["checks"]:
            lines += ["| check | held | detail |", "|---|---|---|"]
            lines += [
                f"| {c['name']} | {'yes' if c['passed'] else '**no**'} | {c['detail'].replace('|', '/')} |"
                for c in s["checks"]
            ]
            lines.append("")
        lines += RENDER.get(name, _render_plain)(s["results"])
    return "\n".join(lines) + "\n"


def _render_plain(r: dict[str, Any]) -> list[str]:
    return [f"- {k}: {v}" for k, v in r.items()]


def _render_training(r: dict[str, Any]) -> list[str]:
    out = []
    if r.get("config"):
        out += [f"Config: {r['config']}", ""]
    out += [
        "| run | precision | compile | updates | first loss | CPU first loss | rel diff | tol | last loss | "
        "tok/s (median, 2nd half) | first update s | peak MiB (training) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, x in (r.get("runs") or {}).items():
        if "skipped" in x or "error" in x:
            out.append(
                f"| {name} | | | | {(x.get('skipped') or x.get('error')).replace('|', '/')[:200]} | | | | | | | |"
            )
            continue
        peak = (x.get("peak_memory_mb_by_phase") or {}).get("training")
        peak = peak if not isinstance(peak, dict) else peak.get("peak_mb", peak.get("allocated_mb"))
        out.append(
            f"| {name} | {x['precision']} | {x['compile']} | {x['updates']} | {_f(x.get('first_loss'), '{:.6f}')} | "
            f"{_f(x.get('cpu_first_loss'), '{:.6f}')} ({x.get('cpu_precision')}) | {_f(x.get('first_loss_rel_diff'), '{:.1e}')} | "
            f"{x.get('tolerance')} | {_f(x.get('last_loss'))} | {_f(x.get('tokens_per_s_median_2nd_half'), '{:,.0f}')} | "
            f"{_f(x.get('first_update_s'), '{:.2f}')} | {_f(peak if isinstance(peak, (int, float)) else x.get('max_memory_allocated_mb'), '{:,.0f}')} |"
        )
        if x.get("cpu_reference_note"):
            out.append(f"| | note: {x['cpu_reference_note']} | | | | | | | | | | |")
    return out


def _render_decoding(r: dict[str, Any]) -> list[str]:
    out = [
        f"{r.get('sentences')} sentences of {r.get('split')}, model after {r.get('model_updates')} updates, fp32, "
        f"{r.get('device_name')} vs the CPU.",
        "",
        "| search | equal | device s | CPU s | mean length | first lines (device) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for key in ("greedy", "beam5"):
        x = r.get(key)
        if x:
            out.append(
                f"| {key} | {x['equal']}/{x['of']} | {x['device_s']:.2f} | {x['cpu_s']:.2f} | {x['mean_len']:.1f} | "
                + " / ".join(x["first_lines"]).replace("|", "/")[:200]
                + " |"
            )
    for key in ("greedy", "beam5"):
        for d in (r.get(key) or {}).get("differing", []):
            out.append(
                f"\n{key} line {d['line']}: device `{d['device']}` ({_f(d['device_score'])}) vs CPU `{d['cpu']}` "
                f"({_f(d['cpu_score'])})"
            )
    return out


def _render_sdpa(r: dict[str, Any]) -> list[str]:
    out = [
        r.get("rules", ""),
        "",
        "| family | phase | precision | attention | calls | backend used | mask | is_causal | "
        "GQA | eligible | why not flash / efficient |",
        "|---|---|---|---|---:|---|---|---|---|---|---|",
    ]
    for x in r.get("calls", []):
        used = ", ".join(f"{b} x{n}" for b, n in x["backends"].items())
        why = "; ".join(f"{b}: {w}" for b, w in x["not_eligible_because"].items() if b in ("flash", "efficient"))
        out.append(
            f"| {x['family']} | {x['phase']} | {x['precision']} | {x['role']} | {x['calls']} | {used} | "
            f"{x['mask_example']} | {x['is_causal']} | {x['enable_gqa']} | {', '.join(x['eligible'])} | "
            f"{why.replace('|', '/')[:240]} |"
        )
    kernels = sorted({k for x in r.get("calls", []) for k in x.get("kernels", [])})
    if kernels:
        out += ["", "CUDA kernels seen under the SDPA calls: " + ", ".join(f"`{k}`" for k in kernels[:12])]
    back = {}
    for x in r.get("calls", []):
        for k, n in (x.get("backward_ops_in_step") or {}).items():
            back[f"{x['family']} {x['precision']}: {k}"] = n
    if back:
        out += ["", "Backward attention ops of the training step: " + "; ".join(f"{k} x{n}" for k, n in back.items())]
    return out


def _render_throughput(r: dict[str, Any]) -> list[str]:
    out = [
        f"Device {r.get('device_name')}; peaks (TFLOP/s) {r.get('peaks_tflops')} from {r.get('peak_source')}"
        + (f"; measured matmul TFLOP/s {r['measured_matmul_tflops']}" if r.get("measured_matmul_tflops") else "")
        + f"; batch {r.get('batch')}, median of {r.get('steps')} steps after {r.get('warmup')}. MFU = 3 x forward "
        "FLOPs (benchmarks/train_throughput.py's count) / step time / peak.",
        "",
        "| size | family | model | precision | target tok/s | ratio to ours | MFU vs bf16 peak | MFU vs dtype peak | "
        "step ms | peak MiB |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r.get("rows", []):
        if "tok_s" not in x:
            out.append(
                f"| {x['size']} | {x['family']} | {x['model']} | {x['precision']} | skipped: "
                f"{x.get('skipped', '').replace('|', '/')[:160]} | | | | | |"
            )
            continue
        out.append(
            f"| {x['size']} | {x['family']} | {x['model']} | {x['precision']} | {x['tok_s']:,.0f} | "
            f"{_f(x.get('ratio_to_ours'), '{:.2f}')} | {100 * x['mfu_vs_bf16_peak']:.1f}% | "
            f"{100 * x['mfu_vs_dtype_peak']:.1f}% | {x['step_ms']:.1f} | {_f(x.get('mem_mb'), '{:,.0f}')} |"
        )
    return out


RENDER: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "trainer": render_trainer,
    "training": _render_training,
    "training_compile": _render_training,
    "decoding": _render_decoding,
    "sdpa": _render_sdpa,
    "throughput": _render_throughput,
    "realistic": render_realistic,
}
