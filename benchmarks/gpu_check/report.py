"""The record of the GPU check (``python -m benchmarks.gpu_check``): ``gpu_check.json`` and ``gpu_check.md``, rewritten
(atomically, :func:`transformer.runs.io.atomic_write_text`) whenever a section changes, the sections'
status and checks, the time budget, and the summary of a ``results_gpu.sh`` study
(``--study-summary``). The ``realistic`` section's tables are drawn by ``render.py``."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import git_commit, one_line
from transformer.analysis.collect import find_run_dirs, load_run
from transformer.analysis.markdown import cell, table
from transformer.runs.io import atomic_write_text

from .render import Column, columns, render_realistic, render_trainer

SECTIONS = (  # the order they run in: what a GPU session is for first, the parity checks done before last
    "environment",
    "trainer",
    "training_compile",
    "realistic",
    "training",
    "decoding",
    "sdpa",
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
        return self._record(name, status="running", started=datetime.datetime.now().isoformat(timespec="seconds"))

    def skip(self, name: str, reason: str) -> None:
        """Record ``name`` as skipped with ``reason``."""
        self._record(name, status="skipped", reason=reason)

    def _record(self, name: str, **fields: Any) -> dict[str, Any]:
        sec = {**fields, "checks": [], "results": {}, "notes": []}
        self.data["sections"][name] = sec
        self.write()
        return sec

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
            error = f"{type(err).__name__}: {err}"
            sec.update(status="failed", error=error, traceback=traceback.format_exc(limit=12)[-4000:])
            print(f"[{name}] failed: {error}", file=sys.stderr, flush=True)
        finally:
            sec["seconds"] = round(time.time() - t, 1)
            self.write()
        print(f"[{name}] {sec['status']} in {sec['seconds']:.0f} s", file=sys.stderr, flush=True)


def check(sec: dict[str, Any], name: str, passed: bool, detail: str = "") -> None:
    """Append one named check to a section."""
    sec["checks"].append({"name": name, "passed": bool(passed), "detail": detail})


@contextlib.contextmanager
def guarded(row: dict[str, Any], traceback_limit: int = 0) -> Iterator[None]:
    """One row of a section, measured inside the block: :class:`OutOfTime` becomes ``row["skipped"]``
    and any other error ``row["error"]`` (:func:`one_line`; with ``traceback_limit``, the last frames in
    ``row["traceback"]`` too), so that the next row still runs; :class:`Stopped` goes on up."""
    try:
        yield
    except Stopped:
        raise
    except OutOfTime as err:
        row["skipped"] = str(err)
    except Exception as err:  # an OOM or a failure stays in its row; the next row runs
        row["error"] = one_line(err)
        if traceback_limit:
            row["traceback"] = traceback.format_exc(limit=traceback_limit)[-2500:]


# ----------------------------------------------------------------------------- study summary


def study_summary(runs_dir: Path, out: Path, device_name: str, note: str) -> dict[str, Any]:
    """Per run folder of a ``results_gpu.sh`` study that has a ``metrics.jsonl``
    (:func:`~transformer.analysis.collect.load_run`): updates reached, last tokens/s, validation and
    test BLEU, the device its ``results.json`` records; written to ``out/study_progress.{json,md}``,
    titled by the finished runs' GPUs, else ``device_name`` (empty when ``runs_dir`` does not exist)."""
    rows, finished = [], []
    for run in map(load_run, find_run_dirs(runs_dir) if runs_dir.is_dir() else []):
        if not (run.run_dir / "metrics.jsonl").is_file():  # a folder that never logged is no row
            continue
        train = [x for x in run.metrics if x.get("split") == "train"]
        valid = [x for x in run.metrics if x.get("split") == "valid"]
        done = run.results
        if done is not None:
            finished.append(done)
        cfg = (run.config or {}).get("train") or {}
        rows.append(
            {
                "run": str(run.run_dir.relative_to(runs_dir)),
                "updates": train[-1]["update"] if train else 0,
                "precision": (done or {}).get("precision") or cfg.get("precision"),
                "device": _run_device(done) or cfg.get("device"),
                "max_updates": cfg.get("max_updates"),
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
    ]
    lines += columns(STUDY, "lllrrllr", map(_study_record, rows))
    atomic_write_text(out / "study_progress.md", "\n".join(lines) + "\n")
    return res


STUDY: list[Column] = [
    ("run", "run", "{}"),
    ("device", "device", "{}"),
    ("precision", "precision", "{}"),
    ("updates / budget", "updates", "{}"),
    ("train tok/s (last window)", "tokens_per_s", "{:,.0f}"),
    ("last valid (update: loss / BLEU)", "last_valid", "{}"),
    ("finished", "finished", "{}"),
    ("test BLEU", "test_bleu", "{:.2f}"),
]


def _study_record(x: dict[str, Any]) -> dict[str, Any]:
    """A summary row as its table shows it."""
    v = x["last_valid"]
    return {
        **x,
        "updates": f"{x['updates']} / {cell(x['max_updates'])}",
        "tokens_per_s": x["tokens_per_s"] or 0,
        "last_valid": f"{v['update']}: {v['loss']:.3f} / {cell(v['bleu'], '{:.2f}') or '-'}" if v else None,
        "finished": "yes" if x["finished"] else "no",
    }


def _run_device(done: dict[str, Any] | None) -> str | None:
    """``cuda:0 (NVIDIA H200)`` / ``cpu`` from a finished run's ``results.json``; None when unfinished."""
    if not done or not done.get("device"):
        return None
    gpu = (done.get("hardware") or {}).get("gpu")
    return f"{done['device']} ({gpu})" if gpu and str(done["device"]).startswith("cuda") else str(done["device"])


# ----------------------------------------------------------------------------- markdown


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
    ]
    status = []
    for name in SECTIONS:
        s = data["sections"].get(name)
        if s is None:
            status.append([name, "not run"])
            continue
        note = s.get("error") or s.get("reason") or "; ".join(s.get("notes", [])) or ""
        if s["status"] == "running":
            note = "incomplete: the process stopped during this section"
        status.append([name, s["status"], cell(s.get("seconds"), "{:.0f}"), cell(note, limit=300)])
    lines += table(["section", "status", "seconds", "note"], "llrl", status)
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
            checks = [[cell(c["name"]), "yes" if c["passed"] else "**no**", cell(c["detail"])] for c in s["checks"]]
            lines += [*table(["check", "held", "detail"], "lll", checks), ""]
        lines += RENDER.get(name, _render_plain)(s["results"])
    return "\n".join(lines) + "\n"


def _render_plain(r: dict[str, Any]) -> list[str]:
    return [f"- {k}: {v}" for k, v in r.items()]


TRAINING: list[Column] = [
    ("run", "run", "{}"),
    ("precision", "precision", "{}"),
    ("compile", "compile", "{}"),
    ("updates", "updates", "{}"),
    ("first loss", "first_loss", "{:.6f}"),
    ("CPU first loss", "cpu_first_loss", "{}"),
    ("rel diff", "first_loss_rel_diff", "{:.1e}"),
    ("tol", "tolerance", "{}"),
    ("last loss", "last_loss", "{:.4f}"),
    ("tok/s (median, 2nd half)", "tokens_per_s_median_2nd_half", "{:,.0f}"),
    ("first update s", "first_update_s", "{:.2f}"),
    ("peak MiB (training)", "peak", "{:,.0f}"),
]


def _render_training(r: dict[str, Any]) -> list[str]:
    out = [f"Config: {r['config']}", ""] if r.get("config") else []
    rows: list[dict[str, Any] | list[str]] = []
    for name, x in (r.get("runs") or {}).items():
        if "skipped" in x or "error" in x:
            rows.append([name, "", "", "", cell(x.get("skipped") or x.get("error"), limit=200)])
            continue
        peak = (x.get("peak_memory_mb_by_phase") or {}).get("training")
        peak = peak if not isinstance(peak, dict) else peak.get("peak_mb", peak.get("allocated_mb"))
        cpu = f"{cell(x.get('cpu_first_loss'), '{:.6f}')} ({x.get('cpu_precision')})"
        peak = peak if isinstance(peak, (int, float)) else x.get("max_memory_allocated_mb")
        rows.append({**x, "run": name, "cpu_first_loss": cpu, "peak": peak})
        if x.get("cpu_reference_note"):
            rows.append(["", cell(f"note: {x['cpu_reference_note']}")])
    return out + columns(TRAINING, "lllrrrrrrrrr", rows)


def _render_decoding(r: dict[str, Any]) -> list[str]:
    out = [
        f"{r.get('sentences')} sentences of {r.get('split')}, model after {r.get('model_updates')} updates, fp32, "
        f"{r.get('device_name')} vs the CPU.",
        "",
    ]
    rows = [
        [
            key,
            f"{x['equal']}/{x['of']}",
            f"{x['device_s']:.2f}",
            f"{x['cpu_s']:.2f}",
            f"{x['mean_len']:.1f}",
            cell(" / ".join(x["first_lines"]), limit=200),
        ]
        for key in ("greedy", "beam5")
        if (x := r.get(key))
    ]
    out += table(["search", "equal", "device s", "CPU s", "mean length", "first lines (device)"], "lrrrrl", rows)
    for key in ("greedy", "beam5"):
        for d in (r.get(key) or {}).get("differing", []):
            out.append(
                f"\n{key} line {d['line']}: device `{d['device']}` ({cell(d['device_score'], '{:.4f}')}) vs CPU "
                f"`{d['cpu']}` ({cell(d['cpu_score'], '{:.4f}')})"
            )
    return out


SDPA: list[Column] = [
    ("family", "family", "{}"),
    ("phase", "phase", "{}"),
    ("precision", "precision", "{}"),
    ("attention", "role", "{}"),
    ("calls", "calls", "{}"),
    ("backend used", "backends", "{}"),
    ("mask", "mask_example", "{}"),
    ("is_causal", "is_causal", "{}"),
    ("GQA", "enable_gqa", "{}"),
    ("eligible", "eligible", "{}"),
    ("why not flash / efficient", "why", "{}"),
]


def _render_sdpa(r: dict[str, Any]) -> list[str]:
    rows = []
    for x in r.get("calls", []):
        why = "; ".join(f"{b}: {w}" for b, w in x["not_eligible_because"].items() if b in ("flash", "efficient"))
        used = ", ".join(f"{b} x{n}" for b, n in x["backends"].items())
        rows.append({**x, "backends": used, "eligible": ", ".join(x["eligible"]), "why": why[:240]})
    out = [r.get("rules", ""), "", *columns(SDPA, "llllrllllll", rows)]
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


RENDER: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "trainer": render_trainer,
    "training": _render_training,
    "training_compile": _render_training,
    "decoding": _render_decoding,
    "sdpa": _render_sdpa,
    "realistic": render_realistic,
}
