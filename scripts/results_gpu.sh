#!/usr/bin/env bash
# Every result run of the project at once on ONE GPU: the 2017 -> Llama-style ladder (7 steps x 3
# seeds, configs/experiment/ladder.yaml) and the Wu et al. 2021 Transformer-Tiny recipe
# (configs/experiment/wu2021_tiny.yaml), one training process per run, all on the same device,
# then the ladder table (scripts/compare.py). The models are tiny, so a single run leaves a large
# GPU mostly idle (each step is a few hundred small kernels); 22 concurrent processes fill it.
# Sized for an H200-class GPU (target: under 10 minutes); smoke-tested on the CPU with 2 updates:
#
#   bash scripts/results_gpu.sh
#   DEVICE=cpu SEEDS=1 EXTRA="train.max_updates=2 train.valid_bleu=false generation.beam_size=1" bash scripts/results_gpu.sh
#
# Environment: OUT (default runs/gpu_<date>), DEVICE (default cuda), SEEDS (default "1 2 3"),
# EXTRA (Hydra overrides added to every run), TRANSFORMER_DATA_DIR (folder holding multi30k/).
# Logs: $OUT/logs/*.log; runs: $OUT/ladder/<step>_seed<n>/, $OUT/wu2021_tiny/seed1/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_$(date +%Y-%m-%d_%H-%M-%S)}
DEVICE=${DEVICE:-cuda}
SEEDS=${SEEDS:-"1 2 3"}
EXTRA=${EXTRA:-}
STEPS="step0_vaswani2017 step1_pre_ln step2_rmsnorm step3_swiglu step4_rope step5_gqa step6_decoder_only"
mkdir -p "$OUT/logs"
start=$(date +%s)

# 1. Binarize each corpus once: the concurrent runs below then only map the cached arrays.
for data in multi30k_en_de multi30k_tok_en_de; do
  python scripts/preprocess.py "data=$data" > "$OUT/logs/preprocess_$data.log" 2>&1
done

# 2. One process per run, all on $DEVICE (one CPU thread each: the device does the arithmetic).
common=("train.device=$DEVICE" train.num_threads=1 train.progress=false)
pids=()
names=()
for step in $STEPS; do
  for seed in $SEEDS; do
    # shellcheck disable=SC2086  # EXTRA is a list of overrides
    OMP_NUM_THREADS=1 python scripts/train.py experiment=ladder "ladder=$step" "seed=$seed" "${common[@]}" \
      "hydra.run.dir=$OUT/ladder/${step}_seed$seed" $EXTRA > "$OUT/logs/ladder_${step}_seed$seed.log" 2>&1 &
    pids+=($!)
    names+=("ladder ${step} seed $seed")
  done
done
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 python scripts/train.py experiment=wu2021_tiny seed=1 "${common[@]}" \
  "hydra.run.dir=$OUT/wu2021_tiny/seed1" $EXTRA > "$OUT/logs/wu2021_tiny_seed1.log" 2>&1 &
pids+=($!)
names+=("wu2021_tiny seed 1")

failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "FAILED: ${names[$i]} (see $OUT/logs)" >&2
    failed=$((failed + 1))
  fi
done
echo "${#pids[@]} runs finished in $(( $(date +%s) - start )) s, $failed failed" >&2

# 3. The ladder table (BLEU mean +- std over seeds, paired bootstrap), from every finished run.
python scripts/compare.py "$OUT"/ladder/* --out "$OUT/ladder_comparison" --baseline step0 > "$OUT/logs/compare.log" 2>&1 \
  || echo "compare.py failed (see $OUT/logs/compare.log)" >&2
echo "results: $OUT/ladder_comparison/comparison.md, $OUT/wu2021_tiny/seed1/results.json" >&2
exit $(( failed > 0 ))
