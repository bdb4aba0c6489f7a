"""Shared test fixtures: deterministic seeds, tiny model configs, the shared data folder."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from transformer.config import ModelConfig, option_config
from transformer.data import download

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TRANSFORMER_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))

torch.set_num_threads(1)  # tiny models gain nothing from more; avoids oversubscription

CALLER_VARIABLES = (
    "HYDRA_FULL_ERROR",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""Variables of the caller's shell that change what the code under test does (the traceback instead of
the one-line error, a torchrun rank); removed for the whole session, with every ``WANDB_*``,
``SLURM_*``, ``SUBMITIT_*`` and ``TORCHELASTIC_*`` variable. A test that needs one sets it itself."""
_CALLER_PREFIXES = ("WANDB_", "SLURM_", "SUBMITIT_", "TORCHELASTIC_")


@pytest.fixture(autouse=True, scope="session")
def _independent_of_the_callers_environment():
    """The suite passes whatever the caller exported (e.g. ``HYDRA_FULL_ERROR=1``, which Hydra's own
    messages tell users to set): the variables above are removed from ``os.environ`` for the session,
    so in-process code and every subprocess a test starts with ``{**os.environ, ...}`` see none."""
    patch = pytest.MonkeyPatch()
    for key in list(os.environ):
        if key in CALLER_VARIABLES or key.startswith(_CALLER_PREFIXES):
            patch.delenv(key)
    yield
    patch.undo()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for torchrun's rendezvous): fixed ports collide when two
    test runs, or a test and a lingering socket, use the same one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(script: str | Path, *args: str, nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run --nproc_per_node=nproc --master_port=<free> script args``:
    ``nproc`` CPU ranks (gloo) on a port of their own."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
        str(script),
        *args,
    ]


@pytest.fixture(autouse=True, scope="session")
def _example_plugins_imported() -> None:
    """Every test process imports the example plugins (``examples/plugins``) before its first test:
    a plugin registers its options into the zoo's tables for the rest of the process, so without this
    a test's view of the tables (e.g. the options an error message lists) would depend on whether a
    plugin test happened to run earlier in its pytest-xdist worker. Tests that mean the built-in
    options skip the ones :data:`transformer.plugins.ORIGINS` names."""
    from transformer.plugins import import_plugins

    import_plugins(
        [REPO_ROOT / "examples" / "plugins" / "diff_attention", REPO_ROOT / "examples" / "plugins" / "reglu"]
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files holding the most ``slow`` tests run first, each file whole, the rest in their order:
    pytest-xdist hands out files (``--dist=loadfile``) in this order, so the longest start first
    and the workers end together instead of one finishing a long file alone."""
    slow: dict[Path, int] = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + bool(item.get_closest_marker("slow"))
    first_seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first_seen[item.path]))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def tiny_model_config(**overrides) -> OmegaConf:
    """A 2+2-layer, width-32 model config (dropout 0) as a DictConfig; dotted keys allowed."""
    cfg = OmegaConf.structured(
        ModelConfig(n_encoder_layers=2, n_decoder_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
    )
    overrides = {key.replace("__", "."): value for key, value in overrides.items()}
    if "attention.name" in overrides:  # the node of the chosen option first: its own fields then exist
        cfg.attention = OmegaConf.structured(option_config("model/attention", overrides["attention.name"]))
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def multi30k_excerpt(folder: Path, sizes: dict[str, int]) -> Path:
    """:func:`transformer.data.download.multi30k_excerpt` of the shared data: the first ``n`` pairs of
    each Multi30k split of ``sizes`` (``{"train": 300, "val": 20, ...}``) in ``folder``."""
    return download.multi30k_excerpt(SHARED_DATA, folder, sizes)


def parallel_text_args(corpus: Path, vocab_size: int) -> list[str]:
    """``scripts/train.py`` overrides that read a :func:`multi30k_excerpt` folder
    (:func:`transformer.data.download.excerpt_overrides`)."""
    return download.excerpt_overrides(corpus, vocab_size)


def train_in_process(monkeypatch, capsys, cwd: Path, *args: str) -> tuple[int, list[str]]:
    """``python scripts/train.py ARGS`` run in ``cwd`` in this process (its ``__main__``, a second or
    two where a new interpreter takes several): (exit status, the lines it wrote on stderr). Hydra's
    global state is cleared after, so that the next test is outside Hydra again."""
    import runpy

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from transformer.config import SWEPT_KEYS_ENV

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [str(REPO_ROOT / "scripts" / "train.py"), *args])
    monkeypatch.setenv(SWEPT_KEYS_ENV, "")  # set for a multirun: restored after
    capsys.readouterr()
    try:
        runpy.run_path(str(REPO_ROOT / "scripts" / "train.py"), run_name="__main__")
        status = 0
    except SystemExit as done:
        status = done.code
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
    return status, capsys.readouterr().err.strip().splitlines()
