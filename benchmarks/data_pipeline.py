"""Benchmark of the data pipeline (not a test): preprocessing, memory, start-up, batching, padding.

Three modes.

**Multi30k** (default): on the real corpus, the time to train the SentencePiece vocabulary and
binarize every split from scratch, the time to map the cached binarized data, and for
``max_tokens`` (default 4096) and both architectures the batches per epoch, the padding fraction
in the sampler's cost model (``1 - sum(item_length) / sum(B * max_length)``), the padding of the
actual input tensors, and the time to build and collate one epoch's batches.

**Synthetic WMT-size corpus** (``--synthetic-pairs N``): a corpus of ``N`` training pairs made of
real Multi30k pairs concatenated two at a time (about 26 subword tokens a side with a 32k joint
BPE, the length of WMT14 en-de sentences), plus a 3,000-pair validation and a 3,003-pair test set
built the same way from Multi30k's validation and test sets. It measures

* ``scripts/preprocess.py`` as a user runs it (a subprocess): wall time, peak memory of the whole
  process tree (sum of RSS and of PSS over the main process and its encoding workers, sampled every
  0.1 s) and of the main process alone, MB on disk, and a second run (a cache hit);
* training start-up per rank (fresh processes, as torchrun starts them): seconds from process
  start until the first batch is collated (``load_translation_data`` + ``TokenBatchSampler`` +
  ``collate``), the data's share of the RSS (RSS minus the RSS after ``import torch``), and the
  same after every token page was read once (the most a rank can hold), with 1 rank and with 2
  ranks at once (PSS shows the mapped files shared between them). Start-up is measured through
  the cache (same data options: the training files are hashed) and through ``data.binarized``.

**Collation** (``--collate MAX_TOKENS ...``): on the Multi30k training split, the host time to
collate one batch, for both architectures at each ``max_tokens``: the first 64 batches of an epoch,
each collated once untimed (every token page read), then 5 timed rounds; the median round's mean.


Usage (from the repository root; the data root defaults to ``$TRANSFORMER_DATA_DIR`` or
``../shared/data``)::

    flock /tmp/cpu.lock python -m benchmarks.data_pipeline [--config multi30k_en_de] [--vocab-size 8000]
    flock /tmp/cpu.lock python -m benchmarks.data_pipeline --synthetic-pairs 290000 --out docs/benchmarks/data_pipeline_290k.json
    flock /tmp/cpu.lock python -m benchmarks.data_pipeline --synthetic-pairs 4500000 --out docs/benchmarks/data_pipeline_4.5M.json
    flock /tmp/cpu.lock python -m benchmarks.data_pipeline --collate 4096 16384
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO, git_commit, module_command
from benchmarks.process_memory import run_monitored, status_kb
from transformer.analysis.markdown import table

MB = 2**20
MEMORY = ("Rss", "Pss", "RssAnon", "RssFile")


# ----------------------------------------------------------------------------- synthetic corpus


def make_synthetic_corpus(folder: Path, n_pairs: int, data_dir: Path, seed: int = 0) -> dict[str, Any]:
    """Write ``train/valid/test.{en,de}`` of concatenated Multi30k pairs into ``folder``.

    Pair ``i`` of a split is ``(en[a] + " " + en[b], de[a] + " " + de[b])`` for random pairs ``a, b``
    of the matching Multi30k split (train for train, val for valid, test_2016_flickr + 2017 for test).
    """
    import numpy as np

    from transformer.data.reading import read_lines

    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    m30k = data_dir / "multi30k"
    sources = {"train": ["train"], "valid": ["val"], "test": ["test_2016_flickr", "test_2017_flickr"]}
    sizes = {"train": n_pairs, "valid": 3000, "test": 3003}
    for split, n in sizes.items():
        lines = {
            lang: [x for s in sources[split] for x in read_lines(m30k / f"{s}.{lang}.gz")] for lang in ("en", "de")
        }
        files = {lang: open(folder / f"{split}.{lang}", "w", encoding="utf-8") for lang in lines}
        for start in range(0, n, 200_000):
            k = min(200_000, n - start)
            a, b = rng.integers(0, len(lines["en"]), (2, k))
            for lang, f in files.items():
                side = lines[lang]
                f.write("".join(f"{side[i]} {side[j]}\n" for i, j in zip(a.tolist(), b.tolist())))
        for f in files.values():
            f.close()
    total = sum(p.stat().st_size for p in folder.iterdir())
    return {"pairs": sizes, "bytes": total, "seconds": round(time.perf_counter() - t0, 1)}


def synthetic_overrides(corpus: Path, cache: Path, vocab_size: int, workers: int) -> list[str]:
    """The ``data.*`` overrides of the synthetic corpus (shared by preprocess and the probes)."""
    return [
        "data=parallel_text",
        f"data.root={corpus}",
        "data.src_lang=en",
        "data.tgt_lang=de",
        "data.train_prefix=train",
        "data.valid_prefix=valid",
        "data.test_prefix=test",
        f"data.vocab_size={vocab_size}",
        f"data.cache_dir={cache}",
        f"data.preprocess_workers={workers}",
        "data.name=synthetic",
    ]


# ----------------------------------------------------------------------------- start-up probe


def probe(overrides: list[str], max_tokens: int, rank: int, world_size: int) -> None:
    """Child process: start like a training rank, report timings and memory as JSON lines.

    Protocol: prints ``{"phase": "ready", ...}`` after the first batch, touches every token page,
    prints ``{"phase": "touched", ...}``, then waits for a line on stdin, prints its memory again
    (``{"phase": "measured", ...}``; with several ranks alive, PSS shows the sharing) and exits.
    """
    t_start = time.perf_counter()
    import numpy as np
    import torch  # noqa: F401  (a training rank has it; its memory is the baseline)
    from hydra import compose, initialize_config_dir

    from transformer.config import register_configs
    from transformer.data.batching import TokenBatchSampler
    from transformer.data.collate import collate
    from transformer.data.dataset import load_translation_data

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    t_import = time.perf_counter()
    base = status_kb("self", *MEMORY)
    data = load_translation_data(cfg.data, log=None)
    t_load = time.perf_counter()
    train = data.splits["train"]
    sampler = TokenBatchSampler(
        train.src_lengths, train.tgt_lengths, max_tokens, seed=1, rank=rank, world_size=world_size
    )
    sampler.set_epoch(1)
    batch = collate(train, next(iter(sampler)), "encoder_decoder")
    t_ready = time.perf_counter()
    ready = status_kb("self", *MEMORY)
    tokens = int(sum(ds.src_lengths.sum() + ds.tgt_lengths.sum() for ds in data.splits.values()))

    def report(phase: str, mem: dict[str, int], **extra: Any) -> None:
        print(
            json.dumps(
                {
                    "phase": phase,
                    "rank": rank,
                    "data_rss_mb": round((mem["Rss"] - base["Rss"]) / 1024, 1),
                    "data_pss_mb": round((mem["Pss"] - base["Pss"]) / 1024, 1),
                    "data_anon_mb": round((mem["RssAnon"] - base["RssAnon"]) / 1024, 1),
                    "rss_mb": round(mem["Rss"] / 1024, 1),
                    **extra,
                }
            ),
            flush=True,
        )

    report(
        "ready",
        ready,
        import_s=round(t_import - t_start, 2),
        load_s=round(t_load - t_import, 2),
        sampler_and_batch_s=round(t_ready - t_load, 2),
        in_process_s=round(t_ready - t_start, 2),
        batches_per_epoch=len(sampler),
        batch_shape=list(batch.net_input["src_tokens"].shape),
        tokens=tokens,
        cache=data.stats["cache"],
    )
    checksum = 0
    for ds in data.splits.values():  # read every page of every token array once
        for seqs in (ds.src, ds.tgt):
            if hasattr(seqs, "tokens"):
                checksum += int(seqs.tokens.sum(dtype=np.int64)) + int(seqs.offsets[-1])
    report("touched", status_kb("self", *MEMORY), checksum=checksum)
    sys.stdin.readline()
    mem = status_kb("self", *MEMORY)
    report("measured", mem, bytes_per_token=round((mem["Rss"] - base["Rss"]) * 1024 / max(tokens, 1), 2))


def run_ranks(overrides: list[str], max_tokens: int, world_size: int) -> list[dict[str, Any]]:
    """Start ``world_size`` probe processes at once; returns one merged report per rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs, starts = [], []
    for rank in range(world_size):
        starts.append(time.perf_counter())
        spec = {"overrides": overrides, "max_tokens": max_tokens, "rank": rank, "world_size": world_size}
        cmd = module_command("data_pipeline", "--probe", json.dumps(spec))
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    reports: list[dict[str, Any]] = [{} for _ in procs]
    for rank, p in enumerate(procs):
        ready = json.loads(p.stdout.readline())
        ready["startup_s"] = round(time.perf_counter() - starts[rank], 2)
        reports[rank]["ready"] = ready
    for rank, p in enumerate(procs):
        reports[rank]["touched"] = json.loads(p.stdout.readline())
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
    for rank, p in enumerate(procs):
        reports[rank]["measured"] = json.loads(p.stdout.readline())
        p.wait()
    return reports


# ----------------------------------------------------------------------------- modes


def synthetic(args: argparse.Namespace) -> dict[str, Any]:
    """The synthetic WMT-size measurements (see the module docstring)."""
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="data_bench_"))
    corpus, cache = work / "corpus", work / "cache"
    try:
        if cache.exists():
            shutil.rmtree(cache)
        gen = make_synthetic_corpus(corpus, args.synthetic_pairs, Path(args.data_dir))
        print(
            f"corpus            {args.synthetic_pairs:,} train pairs, {gen['bytes'] / MB:.0f} MB of text "
            f"(generated in {gen['seconds']}s) in {corpus}",
            flush=True,
        )
        overrides = synthetic_overrides(corpus, cache, args.vocab_size, args.workers)
        cmd = [sys.executable, "scripts/preprocess.py", *overrides]
        first = run_monitored(cmd)
        second = run_monitored(cmd)
        folder = Path(re.search(r"^binarized data: (.+)$", first["stdout"], re.M).group(1))
        disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        manifest = json.loads((folder / "manifest.json").read_text())
        train_manifest = json.loads((folder / manifest["splits"]["train"] / "manifest.json").read_text())
        counts = train_manifest["counts"]
        pre = {k: v for k, v in first.items() if k != "stdout"}
        print(
            f"preprocess        {pre['wall_s']:.1f} s wall, main process peak RSS {pre['peak_main_rss_mb']:.0f} MB; "
            f"second run (cache hit) {second['wall_s']:.1f} s",
            flush=True,
        )
        startup = {}
        for label, extra, ranks in (
            ("cache", [], 1),
            ("binarized", [f"data.binarized={folder}"], 1),
            ("binarized", [f"data.binarized={folder}"], 2),
        ):
            reports = run_ranks(overrides + extra, args.max_tokens, ranks)
            startup[f"{label}_{ranks}rank"] = reports
            for r in reports:
                ready, touched, measured = r["ready"], r["touched"], r["measured"]
                print(
                    f"start-up {label:<9} rank {ready['rank']}/{ranks}: {ready['startup_s']:.1f} s to the first batch "
                    f"(import {ready['import_s']}s, load {ready['load_s']}s, sampler+batch {ready['sampler_and_batch_s']}s); "
                    f"data RSS {ready['data_rss_mb']:.0f} MB at start, {touched['data_rss_mb']:.0f} MB with every token "
                    f"page read ({measured['bytes_per_token']} B/token), PSS {measured['data_pss_mb']:.0f} MB",
                    flush=True,
                )
        return {
            "synthetic_pairs": args.synthetic_pairs,
            "vocab_size": args.vocab_size,
            "workers": args.workers,
            "cpus": len(os.sched_getaffinity(0)),
            "corpus": gen,
            "preprocess": pre,
            "preprocess_cache_hit_s": second["wall_s"],
            "disk_mb": round(disk / MB, 1),
            "train_counts": counts,
            "train_dtype": train_manifest["files"]["src.bin"]["dtype"],
            "startup": startup,
            "max_tokens": args.max_tokens,
            "date": time.strftime("%Y-%m-%d"),
            "commit": git_commit(),
        }
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def padding_figures(train, max_tokens: int, arch: str) -> dict[str, float]:
    """Batch statistics for one epoch of ``train`` (a :class:`~transformer.data.dataset.ParallelDataset`)."""
    from transformer.data.batching import TokenBatchSampler, item_lengths
    from transformer.data.collate import collate

    t = time.perf_counter()
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens, arch=arch, seed=1)
    sampler.set_epoch(1)
    batches = list(sampler)
    build = time.perf_counter() - t
    lengths = item_lengths(train.src_lengths, train.tgt_lengths, arch)
    cost = sum(len(b) * int(lengths[b].max()) for b in batches)
    real = int(lengths.sum())
    t_real = t_all = 0
    t = time.perf_counter()
    for b in batches:
        batch = collate(train, b, arch)
        tensors = (
            [batch.net_input["src_tokens"], batch.net_input["prev_output_tokens"]]
            if arch == "encoder_decoder"
            else [batch.net_input["tokens"]]
        )
        t_real += sum(int(x.ne(0).sum()) for x in tensors)
        t_all += sum(x.numel() for x in tensors)
    return {
        "batches": len(batches),
        "sentences_per_batch": len(train) / len(batches),
        "tokens_per_batch": cost / len(batches),
        "padding_cost_model": 1 - real / cost,
        "padding_tensors": 1 - t_real / t_all,
        "epoch_build_s": build,
        "collate_epoch_s": time.perf_counter() - t,
    }


def collate_ms(train: Any, max_tokens: int, arch: str, rounds: int = 5, max_batches: int = 64) -> dict[str, Any]:
    """The host time to collate one batch of ``train`` (see the module docstring), with the batches'
    mean rows and target tokens."""
    from transformer.data.batching import TokenBatchSampler
    from transformer.data.collate import collate

    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens, arch=arch, seed=1)
    sampler.set_epoch(1)
    batches = list(itertools.islice(sampler, max_batches))
    for b in batches:  # every token page read once
        collate(train, b, arch)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for b in batches:
            collate(train, b, arch)
        times.append((time.perf_counter() - start) * 1000 / len(batches))
    return {
        "arch": arch,
        "max_tokens": max_tokens,
        "batches": len(batches),
        "rows": sum(map(len, batches)) / len(batches),
        "target_tokens": sum(int(train.tgt_lengths[b].sum()) + len(b) for b in batches) / len(batches),
        "collate_ms": statistics.median(times),
    }


def multi30k(args: argparse.Namespace) -> dict[str, Any]:
    """The Multi30k figures, or with ``--collate`` the collation times (see the module docstring)."""
    from omegaconf import OmegaConf

    from transformer.config import DataConfig
    from transformer.data import load_translation_data

    cfg = OmegaConf.merge(
        OmegaConf.structured(DataConfig), OmegaConf.load(REPO / "configs" / "data" / f"{args.config}.yaml")
    )
    cfg.root = args.data_dir
    cfg.preprocess_workers = args.workers
    if args.vocab_size:
        cfg.vocab_size = args.vocab_size
    tmp = tempfile.mkdtemp(prefix="data_bench_")
    cfg.cache_dir = tmp
    try:
        if args.collate:
            train = load_translation_data(cfg, log=None).splits["train"]
            rows = [collate_ms(train, n, arch) for n in args.collate for arch in ("encoder_decoder", "decoder_only")]
            for r in rows:
                print(
                    f"collate {r['arch']:<15} max_tokens {r['max_tokens']:>6}: {r['rows']:.0f} rows, "
                    f"{r['target_tokens']:,.0f} target tokens/batch; {r['collate_ms']:.3f} ms"
                )
            return {"collate": rows}
        t = time.perf_counter()
        data = load_translation_data(cfg, log=None)
        scratch = time.perf_counter() - t
        assert data.stats["tokenizer_cache"] == "miss"  # the vocabulary was trained in this timing
        t = time.perf_counter()
        cached = load_translation_data(cfg, log=None)
        warm = time.perf_counter() - t
        assert cached.stats["cache"] == "hit"
        train = data.splits["train"]
        n_src, n_tgt = int(train.src_lengths.sum()), int(train.tgt_lengths.sum())
        print(f"corpus            {cfg.name} ({cfg.corpus} {cfg.src_lang}->{cfg.tgt_lang}), root {cfg.root}")
        print("splits            " + ", ".join(f"{k} {v}" for k, v in data.stats["sizes"].items()))
        print(
            f"vocabulary        {cfg.spm_model_type}, {len(data.src_tokenizer)} pieces, {'joint' if data.joint_vocab else 'separate'}"
        )
        print(
            f"train pieces      src {n_src} ({n_src / len(train):.1f}/sent), tgt {n_tgt} ({n_tgt / len(train):.1f}/sent)"
        )
        print(f"from scratch      {scratch:.2f} s  (train SentencePiece + binarize all splits)")
        print(f"from cache        {warm:.2f} s  (hash inputs + map the binarized splits)")
        out: dict[str, Any] = {"scratch_s": scratch, "cache_s": warm}
        for arch in ("encoder_decoder", "decoder_only"):
            f = padding_figures(train, args.max_tokens, arch)
            out[arch] = f
            print(
                f"{arch:<17} max_tokens {args.max_tokens}: {f['batches']} batches/epoch, "
                f"{f['sentences_per_batch']:.1f} sent/batch, {f['tokens_per_batch']:.0f} padded tokens/batch, "
                f"padding {100 * f['padding_cost_model']:.2f}% (cost model), "
                f"{100 * f['padding_tensors']:.2f}% (tensors); epoch order {f['epoch_build_s'] * 1000:.0f} ms, "
                f"collate epoch {f['collate_epoch_s']:.2f} s"
            )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


TARGETS = "Targets at 4.5M pairs on 2 cores: preprocess <= 300 s with peak memory <= 2 GB; a rank's data memory <= 1 GB (<= 4 B/token incl. the index); start-up <= 10 s"


def synthetic_table(results: list[dict[str, Any]]) -> list[str]:
    """The table of synthetic-mode results, one line each."""
    rows = []
    for r in results:
        pre, c = r["preprocess"], r["train_counts"]
        one, two = r["startup"]["binarized_1rank"][0], r["startup"]["binarized_2rank"]
        cache = r["startup"]["cache_1rank"][0]
        pss_two = " + ".join(f"{x['measured']['data_pss_mb']:,.0f}" for x in two)
        rows.append(
            [
                f"{r['synthetic_pairs']:,} (vocab {r['vocab_size']:,})",
                f"{c['src_tokens'] + c['tgt_tokens']:,}",
                f"{pre['wall_s']:.0f} s",
                f"{pre['peak_tree_pss_mb']:,.0f} / {pre['peak_tree_rss_mb']:,.0f} MB ({pre['processes']} proc.)",
                f"{r['disk_mb']:,.0f} MB",
                f"{r['preprocess_cache_hit_s']:.1f} s",
                f"{cache['ready']['startup_s']:.1f} s / {one['ready']['startup_s']:.1f} s",
                f"{one['ready']['data_rss_mb']:,.0f} MB -> {one['touched']['data_rss_mb']:,.0f} MB "
                f"({one['measured']['bytes_per_token']} B/token)",
                f"{pss_two} MB",
                f"{r['date']}, `{r['commit']}`",
            ]
        )
    header = ["train pairs", "train tokens", "preprocess wall", "preprocess peak PSS / RSS (tree)", "on disk"]
    header += ["cache hit", "start-up cache / binarized", "data RSS per rank: start -> all pages read"]
    return table([*header, "data PSS, 2 ranks", "measured"], "rrrlrrllll", rows)


def render_markdown(folder: Path) -> str:
    """The page of every ``data_pipeline_*.json`` (synthetic mode) in ``folder``."""
    results = [json.loads(p.read_text()) for p in folder.glob("data_pipeline_*.json")]
    results = sorted((r for r in results if "synthetic_pairs" in r), key=lambda r: r["synthetic_pairs"])
    return "\n".join(
        [
            "# Data pipeline at WMT scale (generated by `benchmarks/data_pipeline.py --synthetic-pairs N --out ...`)",
            "",
            "Synthetic corpus: real Multi30k pairs concatenated two at a time (WMT-like lengths), joint BPE,",
            f"`scripts/preprocess.py` with one encoding worker per CPU. {TARGETS}.",
            "",
            *synthetic_table(results),
            "",
        ]
    )


def main() -> None:
    """Run the benchmark and print the figures (``--out`` also writes them as JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="multi30k_en_de", help="a configs/data/*.yaml name (Multi30k mode)")
    ap.add_argument("--data-dir", default=os.environ.get("TRANSFORMER_DATA_DIR", str(REPO.parent / "shared" / "data")))
    ap.add_argument(
        "--synthetic-pairs", type=int, default=0, help="N > 0: the synthetic WMT-size mode with N training pairs"
    )
    ap.add_argument("--vocab-size", type=int, default=None, help="default: the config's (Multi30k), 32000 (synthetic)")
    ap.add_argument("--workers", type=int, default=0, help="data.preprocess_workers (0 = one per CPU)")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument(
        "--work-dir",
        default=None,
        help="synthetic mode: keep the corpus and cache here (default: a removed temp folder)",
    )
    ap.add_argument(
        "--collate", type=int, nargs="+", metavar="MAX_TOKENS", help="collation time per batch at these max_tokens"
    )
    ap.add_argument("--out", default=None, help="write the figures as JSON")
    ap.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # a start-up probe's JSON spec
    args = ap.parse_args()
    if args.probe:
        probe(**json.loads(args.probe))
        return
    if args.synthetic_pairs > 0:
        args.vocab_size = args.vocab_size or 32000
        result = synthetic(args)
        print("\n".join(synthetic_table([result])))
    else:
        result = multi30k(args)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        if args.synthetic_pairs > 0:
            (out.parent / "data_pipeline.md").write_text(render_markdown(out.parent))


if __name__ == "__main__":
    main()
