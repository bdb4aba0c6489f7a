"""Benchmark of the data pipeline (not a test): vocabulary + encoding time, cache time, padding.

Measures, on a real corpus (Multi30k en-de by default):

* time to train the SentencePiece vocabulary and encode every split from scratch (empty cache),
* time to load the same from the cache,
* for ``max_tokens`` (default 4096) and both architectures: the number of batches per epoch, the
  padding fraction in the sampler's cost model (``1 - sum(item_length) / sum(B * max_length)``),
  the padding fraction of the actual input tensors (encoder-decoder: ``src_tokens`` and
  ``prev_output_tokens`` together; decoder-only: ``tokens``), and the time to build and collate
  one epoch's batches.

Usage (from the repository root; the data root defaults to ``$TRANSFORMER_DATA_DIR`` or
``../shared/data``)::

    flock /tmp/cpu_heavy.lock python benchmarks/data_pipeline.py [--config multi30k_en_de]
        [--vocab-size 8000] [--max-tokens 4096] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402

from transformer.config import DataConfig  # noqa: E402
from transformer.data import TokenBatchSampler, collate, item_lengths, load_translation_data  # noqa: E402


def padding_figures(train, max_tokens: int, arch: str) -> dict[str, float]:
    """Batch statistics for one epoch of ``train``.

    Args:
        train: a :class:`~transformer.data.dataset.ParallelDataset`.
        max_tokens: the sampler's budget (padding included).
        arch: ``encoder_decoder`` or ``decoder_only``.

    Returns:
        Batches, sentences per batch, cost-model and tensor padding fractions, epoch build time.
    """
    t = time.perf_counter()
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens, arch=arch, seed=1)
    sampler.set_epoch(1)
    batches = list(sampler)
    build = time.perf_counter() - t
    lengths = item_lengths(train.src_lengths, train.tgt_lengths, arch)
    cost = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    real = sum(lengths)
    t_real = t_all = 0
    t = time.perf_counter()
    for b in batches:
        batch = collate(train, b, arch)
        if arch == "encoder_decoder":
            tensors = [batch.net_input["src_tokens"], batch.net_input["prev_output_tokens"]]
        else:
            tensors = [batch.net_input["tokens"]]
        t_real += sum(int(x.ne(0).sum()) for x in tensors)
        t_all += sum(x.numel() for x in tensors)
    collate_s = time.perf_counter() - t
    return {
        "batches": len(batches),
        "sentences_per_batch": len(train) / len(batches),
        "tokens_per_batch": cost / len(batches),
        "padding_cost_model": 1 - real / cost,
        "padding_tensors": 1 - t_real / t_all,
        "epoch_build_s": build,
        "collate_epoch_s": collate_s,
    }


def main() -> None:
    """Run the benchmark and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="multi30k_en_de", help="a configs/data/*.yaml name")
    ap.add_argument("--data-dir", default=os.environ.get("TRANSFORMER_DATA_DIR", str(REPO.parent / "shared" / "data")))
    ap.add_argument("--vocab-size", type=int, default=None, help="default: the config's (8000)")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--cache-dir", default=None, help="default: a temporary folder, removed afterwards")
    args = ap.parse_args()

    cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(REPO / "configs" / "data" / f"{args.config}.yaml"))
    cfg.root = args.data_dir
    if args.vocab_size:
        cfg.vocab_size = args.vocab_size
    tmp = None if args.cache_dir else tempfile.mkdtemp(prefix="data_bench_")
    cfg.cache_dir = args.cache_dir or tmp
    if args.cache_dir and Path(args.cache_dir).exists():
        shutil.rmtree(args.cache_dir)
    try:
        t = time.perf_counter()
        data = load_translation_data(cfg, log=None)
        scratch = time.perf_counter() - t
        t = time.perf_counter()
        cached = load_translation_data(cfg, log=None)
        warm = time.perf_counter() - t
        assert cached.stats["cache"] == "hit"
        train = data.splits["train"]
        print(f"corpus            {cfg.name} ({cfg.corpus} {cfg.src_lang}->{cfg.tgt_lang}), root {cfg.root}")
        print(f"splits            " + ", ".join(f"{k} {v}" for k, v in data.stats["sizes"].items()))
        print(f"vocabulary        {cfg.spm_model_type}, {len(data.src_tokenizer)} pieces, "
              f"{'joint' if data.joint_vocab else 'separate'}")
        n_src = sum(train.src_lengths)
        n_tgt = sum(train.tgt_lengths)
        print(f"train pieces      src {n_src} ({n_src / len(train):.1f}/sent), tgt {n_tgt} ({n_tgt / len(train):.1f}/sent)")
        print(f"from scratch      {scratch:.2f} s  (train SentencePiece + encode all splits)")
        print(f"from cache        {warm:.2f} s  (hash inputs + unpickle)")
        for arch in ("encoder_decoder", "decoder_only"):
            f = padding_figures(train, args.max_tokens, arch)
            print(f"{arch:<17} max_tokens {args.max_tokens}: {f['batches']} batches/epoch, "
                  f"{f['sentences_per_batch']:.1f} sent/batch, {f['tokens_per_batch']:.0f} padded tokens/batch, "
                  f"padding {100 * f['padding_cost_model']:.2f}% (cost model), "
                  f"{100 * f['padding_tensors']:.2f}% (tensors); epoch order {f['epoch_build_s'] * 1000:.0f} ms, "
                  f"collate epoch {f['collate_epoch_s']:.2f} s")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
