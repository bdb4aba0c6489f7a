"""``python -m benchmarks.gpu_check``: :func:`.cli.main`."""

import sys

from benchmarks.gpu_check.cli import main

sys.exit(main())
