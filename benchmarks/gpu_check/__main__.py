"""``python -m benchmarks.gpu_check``: the required packages first (one line naming what is missing,
exit 2), then :func:`.cli.main`."""

import sys

from benchmarks.gpu_check import missing_packages

if missing_packages() and "--study-summary" not in sys.argv:
    print(
        "gpu_check: missing packages: " + ", ".join(missing_packages()) + f" (python {sys.executable}); "
        "install the project first: pip install -e . (and transformers for the HF rows)",
        file=sys.stderr,
    )
    sys.exit(2)

# imported after the check: the command line imports torch
from benchmarks.gpu_check.cli import main

sys.exit(main())
