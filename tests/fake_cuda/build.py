"""Compile ``fake_cuda_device.cpp`` against the installed torch (a few seconds, once per torch build)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("fake_cuda_device.cpp")


class ShimUnavailable(RuntimeError):
    """No C++ compiler or no torch headers: the fake-CUDA dry run cannot run here (the message says which)."""


def compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else ``c++`` / ``g++`` / ``clang++`` on the PATH, else None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build_shim(cache_dir: Path) -> Path:
    """The shared library of ``fake_cuda_device.cpp`` for this torch, built into ``cache_dir`` when
    missing (keyed by the source, the torch version and its install folder).

    Args:
        cache_dir: a folder that may keep the library between runs (e.g. pytest's cache).

    Returns:
        The ``.so`` path, to load with ``ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)`` before ``import torch``.

    Raises:
        ShimUnavailable: no C++ compiler, no torch headers, or the compiler failed (its output attached).
    """
    torch_dir = Path(torch.__file__).parent
    include, lib = torch_dir / "include", torch_dir / "lib"
    if not (include / "ATen" / "detail" / "CUDAHooksInterface.h").is_file():
        raise ShimUnavailable(f"torch's C++ headers are not installed under {include}")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(f"{SOURCE.read_text()}|{torch.__version__}|{torch_dir}|{abi}".encode()).hexdigest()[:16]
    out = Path(cache_dir) / f"fake_cuda_device-{key}.so"
    if out.is_file():
        return out
    cxx = compiler()
    if cxx is None:
        raise ShimUnavailable("no C++ compiler (set CXX, or install g++ / clang++)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [
        cxx,
        "-shared",
        "-fPIC",
        "-std=c++17",
        "-O0",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}",
        str(SOURCE),
        f"-L{lib}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{lib}",
        "-o",
        str(tmp),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ShimUnavailable(f"compiling {SOURCE.name} failed:\n{' '.join(cmd)}\n{done.stderr[-3000:]}")
    os.replace(tmp, out)
    return out
