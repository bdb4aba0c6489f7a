"""The GPU path of the project, checked and recorded in one command (``docs/gpu.md``, "The GPU check",
says what each section measures):

    python -m benchmarks.gpu_check --device cuda                 # on a GPU machine: < 6 minutes
    python -m benchmarks.gpu_check --device cpu --quick --out /tmp/gpu_check   # smoke run on a CPU

``cli.py`` holds the command line, the sections' order and the study summary (``--study-summary``),
one module each section; ``report.py`` the time budget and the two files written (``gpu_check.json``
and ``gpu_check.md``, rewritten as each section goes, so that a time cap part way leaves what was done).
"""

from __future__ import annotations

import importlib.util

REQUIRED = {  # module: distribution (what pip install -e . brings)
    "torch": "torch",
    "numpy": "numpy",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "einops": "einops",
    "sentencepiece": "sentencepiece",
    "sacrebleu": "sacrebleu",
    "safetensors": "safetensors",
    "tqdm": "tqdm",
}


def missing_packages() -> list[str]:
    """``module (distribution)`` for every required module that cannot be imported here."""
    return [f"{m} ({d})" for m, d in REQUIRED.items() if importlib.util.find_spec(m) is None]
