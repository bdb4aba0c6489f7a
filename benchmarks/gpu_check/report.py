"""The record of the GPU check: ``gpu_check.json`` and ``gpu_check.md`` in ``--out``, rewritten
(atomically) whenever a section or a row changes, so that a crash or a time cap leaves what was done;
the sections' status and checks, the time budget, and every table of the report, each a list of
columns (:data:`TABLES`) drawn by one helper (:func:`columns`)."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import one_line
from transformer.analysis.markdown import cell, table
from transformer.runs.io import atomic_write_text

SECTIONS = (  # the order they run in: what a GPU session is for first, the parity checks last
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
    """The next piece of work would start past its budget."""


class Budget:
    """Seconds of a budget (0: no limit); every refusal is added to ``skipped`` (a list of its own, or
    the check's, so that the report lists every skip in one place)."""

    def __init__(self, seconds: float, skipped: list[str] | None = None) -> None:
        self.seconds, self.end = seconds, time.time() + seconds if seconds > 0 else math.inf
        self.skipped = [] if skipped is None else skipped

    def need(self, seconds: float, what: str) -> None:
        """Raise :class:`OutOfTime` (and list it) when fewer than ``seconds`` are left for ``what``."""
        left = self.end - time.time()
        if left < seconds:
            self.skipped.append(
                f"{what}: skipped, {max(left, 0):.0f} s of the {self.seconds:.0f} s budget left, ~{seconds:.0f} s needed"
            )
            raise OutOfTime(self.skipped[-1])


class Report:
    """``gpu_check.json`` + ``gpu_check.md`` in ``out``: ``{"meta": meta, "sections": {name: record}}``."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"meta": meta, "sections": {}}

    def write(self) -> None:
        """Write both files (atomically: a reader never sees half a file)."""
        self.data["meta"]["written"] = datetime.datetime.now().isoformat(timespec="seconds")
        atomic_write_text(self.out / "gpu_check.json", json.dumps(self.data, indent=1, default=str) + "\n")
        atomic_write_text(self.out / "gpu_check.md", markdown(self.data))

    def start(self, name: str, status: str = "running", **fields: Any) -> dict[str, Any]:
        """A new section record, written (``running``: what a killed process leaves; or ``skipped``, with a ``reason``)."""
        sec = {"status": status, **fields, "checks": [], "results": {}, "notes": []}
        self.data["sections"][name] = sec
        self.write()
        return sec

    def run(self, name: str, fn: Callable[[dict[str, Any]], None]) -> None:
        """Run section ``fn(sec)``, which fills ``sec["results"]`` and ``sec["checks"]``. Status:
        ``passed`` (every check held), ``failed`` (a check did not hold, or it raised: ``error``,
        ``traceback``), ``skipped`` (it raised :class:`OutOfTime`: ``reason``, its results kept).
        :class:`Stopped` is recorded as a failure and raised on."""
        sec = self.start(name, started=datetime.datetime.now().isoformat(timespec="seconds"))
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
            sec.update(status="failed", error=one_line(err), traceback=traceback.format_exc(limit=12)[-4000:])
            print(f"[{name}] failed: {sec['error']}", file=sys.stderr, flush=True)
        finally:
            sec["seconds"] = round(time.time() - t, 1)
            self.write()
        print(f"[{name}] {sec['status']} in {sec['seconds']:.0f} s", file=sys.stderr, flush=True)


def check(sec: dict[str, Any], name: str, passed: bool, detail: str = "") -> None:
    """Append one named check to a section."""
    sec["checks"].append({"name": name, "passed": bool(passed), "detail": detail})


@contextlib.contextmanager
def guarded(row: dict[str, Any], traceback_limit: int = 0) -> Iterator[None]:
    """One row measured inside the block: :class:`OutOfTime` becomes ``row["skipped"]``, any other
    error ``row["error"]`` (with ``traceback_limit``, its last frames in ``row["traceback"]``), so
    that the next row still runs; :class:`Stopped` goes on up."""
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


# ----------------------------------------------------------------------------- markdown

Column = tuple[str, str, str]  # title, the record's key, the cell's format (transformer.analysis.markdown.cell)


def columns(cols: Sequence[Column], records: Iterable[dict[str, Any]]) -> list[str]:
    """The lines of a table of ``cols``, formatted numbers right-aligned. A record with an ``error``
    or ``skipped`` shows the cells it has up to the first it lacks, then why it has no measurement."""
    rows = []
    for r in records:
        if "error" in r or "skipped" in r:
            n = min(next((i for i, (_, key, _) in enumerate(cols) if key not in r), len(cols)), len(cols) - 1)
            why = f"**failed**: {r['error']}" if "error" in r else f"skipped: {r['skipped']}"
            rows.append([cell(r[key], spec) for _, key, spec in cols[:n]] + [cell(why, limit=220)])
        else:
            rows.append([cell(r.get(key), spec) for _, key, spec in cols])
    align = "".join("l" if spec in ("{}", "**{}**") else "r" for _, _, spec in cols)
    return table([title for title, _, _ in cols], align, rows)


def markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: a status table, what the budget skipped, then one part per section:
    its checks, its ``summary`` and its :data:`TABLES` (the ``environment`` section as a list)."""
    m = data["meta"]
    flags = f"`--device {m['device']}{' --quick' if m['quick'] else ''}`"
    budget = f"budget {float(m['budget_s']):.0f} s" if m["budget_s"] else "no time budget"
    lines = [
        f"# GPU check: {m['device_name']}",
        "",
        f"**GPU results** ({m['device_name']}, {flags})."
        if m["device"] == "cuda"
        else f"**CPU smoke run, not GPU results** ({flags} on {m['device_name']}).",
        "",
        f"Command: `{m['command']}`  ",
        f"Date: {m['date']}; commit `{m['commit']}`; torch {m['torch']}"
        f"{', CUDA ' + str(m['cuda']) if m.get('cuda') else ''}; {budget}; written {m.get('written', '')}",
        "",
    ]
    status = []
    for name in SECTIONS:
        s = data["sections"].get(name, {"status": "not run"})
        note = s.get("error") or s.get("reason") or "; ".join(s.get("notes", []))
        if s["status"] == "running":
            note = "incomplete: the process stopped during this section"
        status.append([name, s["status"], cell(s.get("seconds"), "{:.0f}"), cell(note, limit=300)])
    lines += table(["section", "status", "seconds", "note"], "llrl", status)
    if skipped := data.get("skipped_for_time"):
        lines += [
            "",
            f"Skipped for the time budget ({len(skipped)}; a second call with `--skip` of what ran does them):",
        ]
        lines += ["", *(f"- {x}" for x in skipped)]
    for name in SECTIONS:
        s = data["sections"].get(name)
        if not s or (s["status"] == "skipped" and not s["results"]):
            continue
        r = s["results"]
        lines += ["", f"## {name}", ""]
        if s["checks"]:
            lines += [*columns(CHECKS, s["checks"]), ""]
        if name not in TABLES:
            lines += [f"- {k}: {v}" for k, v in r.items()]
            continue
        for paragraph in r.get("summary", []):
            lines += [paragraph, ""]
        for keys, cols in TABLES[name]:
            found = [r.get(key) or [] for key in keys]  # lists of records, or dicts of them (runs by name)
            if records := [x for v in found for x in (v.values() if isinstance(v, dict) else v)]:
                lines += [*columns(cols, records), ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip("\n") + "\n"


CHECKS: list[Column] = [("check", "name", "{}"), ("held", "passed", "{}"), ("detail", "detail", "{}")]
TARGETS: list[Column] = [
    ("target", "what", "{}"),
    ("bound", "bound_shown", "{}"),
    ("value", "value_shown", "{}"),
    ("status", "status", "**{}**"),
    ("detail", "detail", "{}"),
]
REALISTIC: list[Column] = [  # the realistic section's training rows and the trainer section's
    ("model", "model", "{}"),
    ("system", "system", "{}"),
    ("mode", "mode", "{}"),
    ("max tokens", "max_tokens", "{}"),
    ("rows x src x tgt", "dims", "{}"),
    ("target tokens", "target_tokens", "{:,.0f}"),
    ("padding", "padding", "{:.0%}"),
    ("target tok/s", "tok_s", "{:,.0f}"),
    ("ours / peer", "ratio", "{:.2f}x"),
    ("MFU", "mfu", "{:.1%}"),
    ("step ms", "step_ms", "{:.1f}"),
    ("first step s", "first_step_s", "{:.1f}"),
    ("peak MiB", "mem_mb", "{:,.0f}"),
    ("params", "params", "{:,}"),
    ("graphs", "graphs", "{}"),
]
DECODING: list[Column] = [
    ("system", "system", "{}"),
    ("search", "strategy", "{}"),
    ("seconds", "seconds", "{:.2f}"),
    ("sentences/s", "sentences_per_s", "{:,.1f}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("ours / system", "ratio", "{:.2f}x"),
    ("mean output length", "mean_output_len", "{:.1f}"),
    ("equal to ours", "equal_to_ours", "{:.0%}"),
    ("peak MiB", "peak_mb", "{:,.0f}"),
]
TRAINING: list[Column] = [
    ("run", "run", "{}"),
    ("precision", "precision", "{}"),
    ("compile", "compile", "{}"),
    ("updates", "updates", "{}"),
    ("first loss", "first_loss", "{:.6f}"),
    ("CPU first loss", "cpu_first_loss", "{:.6f}"),
    ("rel diff", "first_loss_rel_diff", "{:.1e}"),
    ("last loss", "last_loss", "{:.4f}"),
    ("tok/s (median, 2nd half)", "tokens_per_s_median_2nd_half", "{:,.0f}"),
    ("first update s", "first_update_s", "{:.2f}"),
    ("peak MiB (training)", "peak_mb", "{:,.0f}"),
]
PARITY: list[Column] = [
    ("search", "search", "{}"),
    ("equal", "equal", "{}"),
    ("of", "of", "{}"),
    ("device s", "device_s", "{:.2f}"),
    ("CPU s", "cpu_s", "{:.2f}"),
    ("mean length", "mean_len", "{:.1f}"),
    ("first difference", "first_difference", "{}"),
]
SDPA: list[Column] = [
    ("family", "family", "{}"),
    ("phase", "phase", "{}"),
    ("precision", "precision", "{}"),
    ("attention", "role", "{}"),
    ("calls", "calls", "{:d}"),
    ("backend used", "used", "{}"),
    ("mask", "mask_example", "{}"),
    ("is_causal", "is_causal", "{}"),
    ("GQA", "enable_gqa", "{}"),
    ("eligible", "eligible_shown", "{}"),
    ("why not flash / efficient", "why", "{}"),
]
TABLES: dict[str, list[tuple[tuple[str, ...], list[Column]]]] = {  # section: (results' keys, columns) of its tables
    "trainer": [(("targets",), TARGETS), (("rows",), REALISTIC)],
    "training_compile": [(("runs",), TRAINING)],
    "realistic": [(("targets",), TARGETS), (("rows", "trainer_rows"), REALISTIC), (("decoding",), DECODING)],
    "training": [(("runs",), TRAINING)],
    "decoding": [(("searches",), PARITY)],
    "sdpa": [(("calls",), SDPA)],
}
