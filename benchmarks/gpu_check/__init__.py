"""The GPU path of the project, checked and recorded in one command (``docs/gpu.md``, "The GPU check",
says what each section measures):

    python -m benchmarks.gpu_check --device cuda                 # on a GPU machine: < 6 minutes
    python -m benchmarks.gpu_check --device cpu --quick --out /tmp/gpu_check   # smoke run on a CPU

``cli.py`` holds the command line, the sections' order and the study summary (``--study-summary``),
one module each section; ``report.py`` the time budget and the two files written (``gpu_check.json``
and ``gpu_check.md``, rewritten as each section goes, so that a time cap part way leaves what was done).
``scripts/gpu_check.sh`` checks the required packages before it runs the check.
"""
