"""The memory of a process tree, from ``/proc`` (Linux): what ``benchmarks/data_pipeline.py``
reports for preprocessing (peak RSS and PSS of every process it starts) and for one rank's data."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO


def status_kb(pid: int | str, *fields: str) -> dict[str, int]:
    """kB fields of ``/proc/<pid>/smaps_rollup`` (Rss, Pss, ...) and ``status`` (VmHWM, ...)."""
    out: dict[str, int] = {}
    for name in ("smaps_rollup", "status"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text()
        except OSError:
            continue
        for f in fields:
            m = re.search(rf"^{f}:\s+(\d+) kB", text, re.M)
            if m and f not in out:
                out[f] = int(m.group(1))
    return out


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc/*/stat``)."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def run_monitored(cmd: list[str], interval: float = 0.1) -> dict[str, Any]:
    """Run ``cmd``, sampling the memory of its process tree; returns wall time, peaks (MiB) and stdout."""
    peaks = {"tree_rss": 0, "tree_pss": 0, "main_rss": 0, "processes": 0}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pids = descendants(proc.pid)
            stats = [status_kb(p, "Rss", "Pss") for p in pids]
            peaks["tree_rss"] = max(peaks["tree_rss"], sum(s.get("Rss", 0) for s in stats))
            peaks["tree_pss"] = max(peaks["tree_pss"], sum(s.get("Pss", 0) for s in stats))
            peaks["main_rss"] = max(peaks["main_rss"], status_kb(proc.pid, "VmHWM").get("VmHWM", 0))
            peaks["processes"] = max(peaks["processes"], len(pids))
            done.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    thread.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "peak_tree_rss_mb": round(peaks["tree_rss"] / 1024, 1),
        "peak_tree_pss_mb": round(peaks["tree_pss"] / 1024, 1),
        "peak_main_rss_mb": round(peaks["main_rss"] / 1024, 1),
        "processes": peaks["processes"],
        "stdout": stdout,
    }
