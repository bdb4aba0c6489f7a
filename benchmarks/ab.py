"""The A/B harness of the default run: one fresh ``scripts/train.py`` process under ``/usr/bin/time``
and what it measured; a library, no command line (``ab_runs.py`` is its benchmark).

Every process trains the default model on Multi30k for a number of updates with no validation on
the way (:data:`FIXED`; the end's validation loss and its one test split, ``test_2016_flickr``, come
after the training time its tokens/s are measured over), the measuring command of
the default run, and logs update 1 and the last update only (``train.log_every`` past the end), so
that ``metrics.jsonl`` times the first update alone and the others as one window. Run an A/B alone
(``flock /tmp/cpu.lock``): timing beside other work measures the other work.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import REPO

FIXED = [
    "train.max_time=0",
    "train.validate_every=100000",
    "train.valid_bleu=false",
    "data.test_splits=[]",
    "train.progress=false",
]
"""The overrides of every A/B process: no validation before the end, no BLEU, one test split (the data's first)."""


def train_process(variant: str, updates: int, data_root: str, workdir: Path, root: Path = REPO) -> dict:
    """One ``scripts/train.py`` process of ``variant`` (space-separated overrides) with the checkout
    ``root`` (its ``scripts/train.py`` and its ``transformer`` package, ahead of any installed one)
    under ``/usr/bin/time``, and its measurements: target tokens/s over the whole training time
    (``results.json``, compiling included), tokens/s of updates 2 to N (the last ``metrics.jsonl``
    record: compiled code running, recompilations included), the first update's seconds (its target
    tokens over its tokens/s; compiled: mostly compiling), the recompilations dynamo logged
    (``TORCH_LOGS=recompiles``; each compiled function's first graph is not one), the peak resident
    memory (``/usr/bin/time -f %M``), the precision, the CPU and the distinct batch shapes the run logged.

    Raises:
        RuntimeError: the process failed (the variant, its exit status and its ``error:`` line, else
            the end of its stderr).
    """
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    cmd = ["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, str(root / "scripts" / "train.py")]
    cmd += [f"train.max_updates={updates}", *FIXED, f"train.log_every={updates + 1}", *variant.split()]
    env = {**os.environ, "TRANSFORMER_DATA_DIR": data_root, "PYTHONPATH": str(root), "TORCH_LOGS": "recompiles"}
    out = subprocess.run([*cmd, f"hydra.run.dir={run_dir}"], cwd=root, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        said = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        raise RuntimeError(
            f"{variant or '(default)'}: exit {out.returncode}: {said[-1] if said else out.stderr[-2000:]}"
        )
    results = json.loads((run_dir / "results.json").read_text())
    metrics = run_dir / "metrics.jsonl"  # an older checkout may log less: its columns stay empty
    logged = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    train = [r for r in logged if r.get("split") == "train" and "tokens_per_s" in r]
    shapes = re.search(r"batches: (\d+) distinct", out.stderr)
    return {
        "variant": variant,
        "tok_s": results["train_tokens_per_s"],
        "tok_s_after_first": train[-1]["tokens_per_s"] if train and train[-1].get("update", 0) > 1 else None,
        "first_update_s": train[0]["ntokens"] / train[0]["tokens_per_s"] if train and "ntokens" in train[0] else None,
        "recompiles": out.stderr.count("Recompiling function"),
        "updates": results["updates"],
        "rss_mb": int(re.search(r"maxrss_kb=(\d+)", out.stderr).group(1)) / 1024,
        "peak_memory_mb": results.get("peak_memory_mb"),
        "precision": results.get("precision"),
        "cpu": (results.get("hardware") or {}).get("cpu_capability"),
        "shapes": int(shapes.group(1)) if shapes else None,
    }
