"""The child process of the fake-CUDA dry run.

    python -m tests.fake_cuda.runner SHIM.so PLAN.json RESULTS.json

loads the stand-in CUDA backend (``SHIM.so``, from :func:`tests.fake_cuda.build.build_shim`)
*before* torch is imported, runs the plan (:func:`tests.fake_cuda.dry_run.run_plan`) and writes the
results as JSON. A child process, because torch reads its CUDA hooks once, at import, and because the
``torch.cuda`` patches and serialization tagger of the dry run must not leak into other tests.
"""

from __future__ import annotations

import ctypes
import json
import sys


def main(argv: list[str]) -> int:
    """Entry point; ``argv`` = ``[shim, plan, results]``. Returns the exit status (0)."""
    shim, plan_path, out_path = argv
    if "torch" in sys.modules:
        raise RuntimeError("torch was imported before the fake CUDA backend was loaded")
    ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
    import torch

    if torch._C._accelerator_getAccelerator() != torch.device("cuda"):
        raise RuntimeError(
            f"the fake CUDA backend did not register (accelerator: {torch._C._accelerator_getAccelerator()})"
        )
    from tests.fake_cuda.dry_run import run_plan

    torch.set_num_threads(1)
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    results = run_plan(plan)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
