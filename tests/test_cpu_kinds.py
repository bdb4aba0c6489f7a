"""The files that hold floats to values recorded on one machine pass with the kernels of every CPU
kind CI may run on.

ATen picks its vectorised CPU kernels at start-up from the machine (an AVX2-only EPYC, a Zen 4 EPYC
with AVX-512, a Xeon with AMX) unless ``ATEN_CPU_CAPABILITY`` names them; their sums round
differently, so a recorded value held too tightly fails on another kind of machine. This test runs
:data:`RECORDED_VALUE_FILES` in fresh processes under each capability below that of this machine, so
that such a tolerance fails on any x86 machine (docs/contributing.md, "Values recorded on one
machine").
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO_ROOT

RECORDED_VALUE_FILES = (
    "tests/generation/test_search_unchanged.py",  # decoding scores and log-probabilities of 271 cases
    "tests/training/step/test_criterion.py",  # the label-smoothed loss against a hand computation
)
"""Test files comparing floats computed by ATen kernels with numbers written down on one machine."""

CAPABILITIES = ("default", "avx2", "avx512")
"""``ATEN_CPU_CAPABILITY`` values of x86 CPUs, from the oldest kernels to the newest."""


def _capabilities_here() -> list[str]:
    """The capabilities this machine can run (its own and every older one)."""
    own = torch.backends.cpu.get_cpu_capability().lower()  # "AVX512", "AVX2", "DEFAULT"
    return list(CAPABILITIES[: CAPABILITIES.index(own) + 1]) if own in CAPABILITIES else ["default"]


def test_every_recorded_value_file_exists() -> None:
    assert all((REPO_ROOT / f).is_file() for f in RECORDED_VALUE_FILES)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="ATen's x86 kernel choice")
@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_recorded_values_hold_under_other_kernels(capability: str) -> None:
    """``ATEN_CPU_CAPABILITY=default`` and ``=avx2`` beside the machine's own kernels (which the
    rest of the suite runs): about 20 s of CPU each."""
    if capability not in _capabilities_here():
        pytest.skip(f"this CPU cannot run the {capability} kernels")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    chosen = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert chosen.stdout.strip().lower() == capability  # torch honours the variable
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *RECORDED_VALUE_FILES],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}:\n{done.stdout[-4000:]}"
