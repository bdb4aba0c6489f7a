"""The GPU path of the project, checked and recorded in one command.

    python -m benchmarks.gpu_check --device cuda                 # on a GPU machine: < 6 minutes
    python -m benchmarks.gpu_check --device cpu --quick --out /tmp/gpu_check   # smoke run on a CPU

(from the repository root: ``benchmarks/gpu_check/`` is a package of the ``benchmarks`` package; its
modules import ``benchmarks.train_step`` and ``benchmarks.peers``).

``scripts/gpu_check.sh`` runs this and then ``scripts/results_gpu.sh`` under one time cap (the one
prepared command for a GPU machine). Results go to ``--out`` (default ``docs/benchmarks/gpu/`` with
``--device cuda``, ``runs/gpu_check_cpu/`` with ``--device cpu``, so a CPU run never overwrites GPU
results): ``gpu_check.json`` and ``gpu_check.md``, both rewritten after every section and inside the
long ones after every run or row, so a crash or a time cap part way leaves what was done on disk
(a section cut off is marked ``running``). Every file names the device. Checkpoints, the CPU smoke
corpus and its data cache go to ``--work`` (default ``runs/gpu_check_work/``), never to ``--out``; on
the GPU, Multi30k is binarized into the project's default data cache, where ``results_gpu.sh`` finds it.

Sections, in the order they run (each one wrapped: a failing section is recorded as ``failed``
with its error or the checks that did not hold, and the others still run; ``--skip NAME`` records
one as ``skipped``, and so does the time budget when nothing of it fits):

* ``environment``: device name and capability, torch / CUDA / cuDNN / triton / transformers
  versions, TF32 and SDPA backend flags, CPU, the data folder; what is missing is said here.
* ``trainer`` (first: what a user's run does every update; :mod:`.trainer_rows`):
  :meth:`~transformer.training.loop.trainer.Trainer.train_step` itself on its own data path
  (prefetched, pinned, ``non_blocking``) with ``transformer_2017_base`` at ``train.max_tokens=16384``
  on Multi30k pairs joined to WMT-like lengths (target mean 27 pieces, a tail past 128) at a 32k
  vocabulary, ``train.precision=auto``: eager, compiled (``train.compile=true``, dynamic shapes) and
  through DDP over a 1-rank process group; target tokens/s, ms per update and MFU over 30 updates
  timed together after 5, the first update's time and the compile time apart, graphs compiled; the
  rows also appear in the realistic section's table, and the base model's MFU target is read from them.
* ``training_compile``: the ``training`` check below with ``train.compile=true`` (bf16, then fp32:
  ``--compile-precision``): the first update's time includes the first compile (a later batch shape
  recompiles once, with dynamic shapes).
* ``realistic`` (:mod:`.realistic`): ``transformer_2017_base``, ``transformer_2017_big`` and a ~100M-parameter
  ``llama_style`` at a 32k vocabulary, bf16, the median batch of the project's batching of
  Multi30k at 8k, 16k and 32k tokens, eager / compiled (``torch.compile`` of the loss function:
  forward, loss and backward) / compiled with CUDA graphs (``mode="reduce-overhead"``), ours beside
  HF Marian and HF Llama at the same sizes and batches: target tokens/s, MFU against the bf16 peak
  counting real tokens only, peak memory; then greedy and beam-5 decoding of 1,000 test sentences at
  batch 64, ours beside HF ``generate`` and CTranslate2 (:mod:`.realistic_decoding`); judged against
  the targets of :mod:`.targets`. Rows run in priority order, each guarded (an error or an OOM is
  recorded in its row), within ``--realistic-budget-s`` (GPU default 240 s) and the check's budget.
* ``training``: the project's own loop (:meth:`transformer.training.loop.trainer.Trainer.fit`, the loop
  behind ``scripts/train.py``) on Multi30k en-de with ``transformer_tiny`` (dropout 0, so that the
  CPU and the GPU draw no random numbers), ``train.precision`` fp32 and bf16 with ``train.compile``
  off: losses finite and falling; the first update's loss against the same config's first update on
  the CPU, computed in this process (relative tolerance fp32 1e-4, bf16 1e-2; a CPU without fast
  bf16 gives the bf16 run the fp32 CPU reference); training tokens/s (the trainer's own count) and
  peak memory. The fp32 run trains longer (``--decode-updates``): it is the model the decoding
  section translates with.
* ``decoding``: greedy and beam 5 on the first 50 test sentences (test_2016_flickr) with that model
  in fp32, on the device and on a CPU copy: the number of equal hypotheses and the first differing
  lines with their scores.
* ``sdpa``: which ``scaled_dot_product_attention`` kernel ran (torch.profiler's aten op under each
  call: flash, memory-efficient, cuDNN, math; the CUDA kernel names too) for the encoder-decoder
  and the decoder-only family, training forward (fp32 and bf16) and decoding (greedy and beam),
  per attention role (encoder self, decoder self, cross); then each call's arguments replayed with
  one backend allowed at a time (``torch.nn.attention.sdpa_kernel``), which gives the eligible
  backends and torch's own reason for each one that is not (e.g. flash takes no ``attn_mask``).
* ``throughput``: ``benchmarks/train_throughput.py``'s machinery (same models, batches, FLOP count,
  optimizer) in this process at tiny, small and base sizes, ours beside HF Marian / HF Llama at the
  same dims, fp32 and bf16 autocast: target tokens/s (median step), MFU against the device's dense
  bf16 peak (H200: 989 TFLOP/s; :data:`train_step.DEVICE_PEAKS`, else a matmul probe) and
  against the row's dtype peak, peak memory (``torch.cuda.max_memory_allocated``).

The whole check keeps to ``--budget-s`` (GPU default 320 s; ``scripts/gpu_check.sh`` caps the
process at 360 s, so one device call leaves a 15-minute session the time for a second): a section,
run or row that would start past it is recorded as skipped for the time budget, and the report
lists every such skip under its status table (a second call with ``--skip`` of the sections that
ran does them). SIGTERM (``timeout``) records the section in progress as failed and stops.

``--study-summary RUNS_DIR`` (used by ``scripts/gpu_check.sh``) instead summarises the run folders
of a ``scripts/results_gpu.sh`` study (updates reached, tokens/s, BLEU) into ``--out``.

Where the code is: ``cli.py`` (the command line and the order the sections run in; ``__main__.py``
calls it after checking the required packages), ``report.py`` (the two files, the sections' status
and checks, the time budget, the guard of one measured row, the study summary: run folders read with
:mod:`transformer.analysis.collect`), ``context.py`` (the ``environment`` section and
what the sections share: the context, the runs' configs, one training run), ``trainer_rows.py``
(``trainer``: its WMT-like corpus and rows), ``training.py`` (``training``, ``training_compile``,
``decoding``), ``sdpa.py``, ``throughput.py`` (on ``train_step.py``'s machinery), ``realistic.py``
with ``presets.py`` (its models), ``batches.py`` (its batches and FLOP count),
``realistic_decoding.py``, ``targets.py`` and ``render.py`` (its Markdown and the trainer's; every
table is written with :mod:`transformer.analysis.markdown`). The
bf16 peaks are ``train_step.DEVICE_PEAKS`` (H100 SXM / PCIe / NVL, H200 / H200 NVL, A100, L40S,
L40, L4 by the name torch gives the device).
"""

from __future__ import annotations

import importlib.util

REQUIRED = {  # module: distribution (what pip install -e . brings)
    "torch": "torch",
    "numpy": "numpy",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "einops": "einops",
    "sentencepiece": "sentencepiece",
    "sacrebleu": "sacrebleu",
    "safetensors": "safetensors",
    "tqdm": "tqdm",
}


def missing_packages() -> list[str]:
    """``module (distribution)`` for every required module that cannot be imported here."""
    return [f"{m} ({d})" for m, d in REQUIRED.items() if importlib.util.find_spec(m) is None]
