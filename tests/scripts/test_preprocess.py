"""scripts/preprocess.py on a generated corpus of WMT14's shape (data=wmt14_en_de), then training's loader.

WMT14 cannot be downloaded here, so the corpus has its file layout (train, newstest2013,
newstest2014) and WMT-like sentence lengths: real Multi30k pairs concatenated two at a time.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import REPO_ROOT, SHARED_DATA
from transformer.config import register_configs, validate_config
from transformer.data.dataset import load_translation_data
from transformer.data.reading import read_lines, read_parallel


def _wmt14_shaped(root: Path) -> Path:
    if not (SHARED_DATA / "multi30k" / "train.en.gz").is_file():
        pytest.skip(f"real Multi30k data not found under {SHARED_DATA}")
    rng = random.Random(0)
    sizes = {"train": ("train", 3000), "newstest2013": ("val", 200), "newstest2014": ("test_2016_flickr", 203)}
    root.mkdir()
    for prefix, (source, n) in sizes.items():
        en, de = (read_lines(SHARED_DATA / "multi30k" / f"{source}.{lang}.gz") for lang in ("en", "de"))
        pairs = [(rng.randrange(len(en)), rng.randrange(len(en))) for _ in range(n)]
        for lang, side in (("en", en), ("de", de)):
            lines = [f"{side[a]} {side[b]}" for a, b in pairs]
            if prefix == "train" and lang == "de":
                lines[17] = ""  # one pair with an empty side: dropped and counted
            (root / f"{prefix}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _preprocess(*overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "scripts/preprocess.py", *overrides],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _data_cfg(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=["data=wmt14_en_de", *overrides]).data


def test_preprocess_wmt14_shaped_corpus_then_train_loader(tmp_path: Path) -> None:
    root = _wmt14_shaped(tmp_path / "wmt14")
    args = ["data=wmt14_en_de", f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=800"]
    out = _preprocess(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    folder = Path(re.search(r"^binarized data: (.+)$", out.stdout, re.M).group(1))
    assert folder.parent == tmp_path / "cache" and (folder / "spm.model").is_file()
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if "pairs" in line}
    assert set(rows) == {"train", "valid", "test", "newstest2014"}
    assert re.search(r"2,999 pairs .* 1 dropped \(empty side\) .* miss", rows["train"])
    # a second run builds nothing
    again = _preprocess(*args)
    assert again.returncode == 0 and '"cache": "hit"' in again.stdout
    # training reads it: through the cache (same data options) and through data.binarized, equal to the text
    for extra in ([f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}"], [f"data.binarized={folder}"]):
        data = load_translation_data(_data_cfg("data.vocab_size=800", *extra), log=None)
        assert data.stats["cache"] == "hit" and data.stats["cache_dir"] == str(folder)
        for name, prefix in (("train", "train"), ("valid", "newstest2013"), ("newstest2014", "newstest2014")):
            src, tgt, _ = read_parallel(root / f"{prefix}.en", root / f"{prefix}.de")
            assert data.splits[name].tgt.tolist() == data.tgt_tokenizer.encode_batch(tgt), name
            assert len(data.splits[name]) == len(src)
        assert data.splits["test"] is data.splits["newstest2014"] and data.splits["test"].tgt_text[0] == tgt[0]
        assert 40 < data.splits["train"].src_lengths.mean() < 80  # WMT-like lengths (at this small vocabulary)


def test_preprocess_bad_lines_exit_1_naming_file_and_line(tmp_path: Path) -> None:
    root = _wmt14_shaped(tmp_path / "wmt14")
    lines = (root / "newstest2013.de").read_bytes().split(b"\n")
    lines[6] = b"kaputt \xc3 ("
    (root / "newstest2013.de").write_bytes(b"\n".join(lines))
    args = ["data=wmt14_en_de", f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=800"]
    out = _preprocess(*args)
    assert out.returncode == 1
    assert re.search(rf"^error: {root}/newstest2013\.de: invalid UTF-8 on line 7 ", out.stderr, re.M), out.stderr
    (root / "newstest2013.de").write_bytes(gzip.compress(b"eins\nzwei\n"))
    out = _preprocess(*args)
    assert out.returncode == 1
    assert f"{root}/newstest2013.en has 200 lines, {root}/newstest2013.de has 2 lines" in out.stderr
    assert not [p for p in (tmp_path / "cache").rglob("*.tmp")]  # nothing half-written left behind


def _experiment(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=["experiment=wmt14_en_de_base", *overrides])


def test_wmt14_base_experiment_is_the_paper_recipe() -> None:
    cfg = _experiment()
    validate_config(cfg)
    m, t, g = cfg.model, cfg.train, cfg.generation
    assert cfg.data.name == "wmt14_en_de" and cfg.data.vocab_size == 37000 and cfg.data.joint_vocab
    assert (m.arch, m.d_model, m.n_heads, m.d_ff, m.n_encoder_layers, m.n_decoder_layers, m.dropout) == (
        "encoder_decoder",
        512,
        8,
        2048,
        6,
        6,
        0.1,
    )
    assert (cfg.optim.name, list(cfg.optim.betas), cfg.optim.eps) == ("adam", [0.9, 0.98], 1e-9)
    assert (cfg.lr_scheduler.form, cfg.lr_scheduler.warmup_updates, cfg.criterion.label_smoothing) == (
        "noam",
        4000,
        0.1,
    )
    assert t.max_tokens * t.update_freq * 8 == 25_000  # target tokens per update on 8 GPUs
    assert (t.max_updates, t.average_last, t.keep_last) == (100_000, 5, 5) and 0 < t.save_every < t.max_updates
    assert (g.strategy, g.beam_size, g.length_penalty, g.max_len_a, g.max_len_b) == ("beam", 4, 0.6, 1.0, 50)
    # the variants docs/sweeps.md shows stay valid: 1 GPU with update_freq 8, the big model sharded in bf16
    validate_config(_experiment("train.update_freq=8"))
    big = _experiment(
        "model=transformer_2017_big",
        "train.distributed=fsdp",
        "train.precision=bf16",
        "train.activation_checkpointing=true",
    )
    validate_config(big)
    assert big.model.d_model == 1024 and big.train.max_tokens == 3125


def _sbatch(
    tmp_path: Path, tiny: list[str], usr1_after_update: int | None = None
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Preprocess a WMT14-shaped corpus, then run scripts/wmt14_en_de.sbatch with srun and scontrol
    stood in for by local commands (scontrol records its arguments); optionally send the batch shell
    USR1 (SLURM's --signal=B:USR1@300) once training has logged ``usr1_after_update``."""
    root = _wmt14_shaped(tmp_path / "wmt14")
    out = _preprocess(
        "data=wmt14_en_de", f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=800"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    folder = re.search(r"^binarized data: (.+)$", out.stdout, re.M).group(1)
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "scontrol.calls"
    (fake / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (fake / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho localhost\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PATH": f"{fake}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NNODES": "1",
        "SLURM_JOB_ID": "77",
        "GPUS_PER_NODE": "2",
        "PORT": str(port),
        "BINARIZED": folder,
        "RUN_DIR": str(run),
        "SLURM_SUBMIT_DIR": str(REPO_ROOT),
    }
    # Own process group: a timeout kills the sbatch script's torchrun and ranks too, not only bash.
    proc = subprocess.Popen(
        ["bash", str(REPO_ROOT / "scripts" / "wmt14_en_de.sbatch"), *tiny],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if usr1_after_update is not None:
            deadline = time.time() + 300
            while time.time() < deadline and proc.poll() is None:
                metrics = run / "metrics.jsonl"
                if metrics.is_file() and f'"update": {usr1_after_update},' in metrics.read_text():
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGUSR1)  # to the batch shell only, as B: does
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), run, calls


TINY = [
    "data.vocab_size=800",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "model.d_model=32",
    "model.n_heads=4",
    "model.d_ff=64",
    "train.validate_every=0",
    "train.valid_bleu=false",
    "train.precision=fp32",
    "train.num_threads=1",
    "train.device=cpu",
    "generation.beam_size=2",
    "generation.max_len_b=2",
]


def test_wmt14_recipe_preprocess_then_sbatch_script(tmp_path: Path) -> None:
    """docs/sweeps.md's cluster path at a tiny size: preprocess once, then scripts/wmt14_en_de.sbatch
    (one node, torchrun with 2 CPU ranks, c10d rendezvous) trains experiment=wmt14_en_de_base from
    the binarized folder and averages the last checkpoints for the test."""
    out, run, calls = _sbatch(tmp_path, [*TINY, "train.max_updates=2", "train.save_every=1", "train.average_last=2"])
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert (
        results["world_size"] == 2
        and results["updates"] == 2
        and results["choices"]["experiment"] == "wmt14_en_de_base"
    )
    assert "average of checkpoint_1, checkpoint_2" in out.stderr and set(results["test"]) == {"newstest2014"}
    assert "requeue" not in calls.read_text()


@pytest.mark.slow
def test_sbatch_time_limit_signal_stops_politely_then_requeues(tmp_path: Path) -> None:
    """SLURM's USR1 ahead of the time limit: both ranks stop after one update with checkpoint_last
    saved, then the script requeues the job; the requeued job (the same script) continues."""
    tiny = [*TINY, "train.max_updates=3000", "train.save_every=0", "train.average_last=0", "train.log_every=1"]
    out, run, calls = _sbatch(tmp_path, tiny, usr1_after_update=3)
    assert "time limit near: stopping the training politely, then requeueing job 77" in out.stdout, out.stderr[-3000:]
    stopped = re.findall(
        r"stopped by (?:SIGTERM|a signal on another rank) after update (\d+): checkpoint_last saved", out.stderr
    )
    assert stopped and len(set(stopped)) == 1, out.stderr[-3000:]
    assert json.loads((run / "checkpoint_last.json").read_text())["update"] == int(stopped[0])
    assert calls.read_text().splitlines()[-1] == "requeue 77"
    assert not (run / "results.json").exists()
