#!/usr/bin/env bash
# Every result run of the project at once on ONE GPU: the 2017 -> Llama-style ladder (7 steps x 2
# seeds, configs/experiment/ladder.yaml), the Wu et al. 2021 Transformer-Tiny recipe
# (configs/experiment/wu2021_tiny.yaml) and, when LENGTH names position switches, the
# length-generalization study's runs (configs/experiment/length.yaml), one training process per
# run, all on the same device, then the ladder table (scripts/compare.py). The models are tiny, so
# a single run leaves a large GPU mostly idle (each step is a few hundred small kernels); 15
# concurrent processes fill it. Run on an H200 for three runs at once (2026-12-04: the last line
# below, 695 s; docs/results/gpu/README.md); scripts/gpu_check.sh runs it after
# the GPU check (python -m benchmarks.gpu_check); smoke-tested on the CPU (tests/benchmarks/test_gpu_check.py):
#
#   bash scripts/results_gpu.sh
#   OUT=runs/gpu_study TIME_LIMIT=300 bash scripts/results_gpu.sh    # stop politely after 300 s; the same line continues
#   DEVICE=cpu SEEDS=1 EXTRA="train.max_updates=2 train.valid_bleu=false generation.beam_size=1" bash scripts/results_gpu.sh
#   STEPS= LENGTH="sinusoidal learned" SEEDS=2 WU_SEEDS=2 DEVICE=auto bash scripts/results_gpu.sh   # only these runs
#
# What the runs train is what the experiments pin, unchanged on the GPU: train.precision=fp32 (not
# bf16, so that GPU runs are comparable with the CPU runs of docs/results/: compare.py refuses a
# table that mixes precisions), train.num_threads=1 and train.resume=auto (a run that finds its
# checkpoint_last continues from it, a complete run is left as it is: rerunning this script with
# the same OUT continues every unfinished run). The run folders keep the ladder's own naming
# (<step>_seed<seed>, as runs/ladder/ by default) under $OUT, so GPU runs never mix with the CPU
# runs of runs/ladder/.
#
# Environment: OUT (default runs/gpu_<date>), DEVICE (default cuda), SEEDS (default "1 2", the
# study's seeds), STEPS (default: the 7 ladder steps; empty: no ladder run), LENGTH (position
# switches of the length study, e.g. "rope alibi sinusoidal learned", each for every seed of SEEDS;
# default none), WU (1: also the Wu et al. runs; 0: not), WU_SEEDS (default 1: the Wu et al. seeds),
# EXTRA (Hydra overrides added to every run), PREPROCESS (1: binarize Multi30k first; 0 when EXTRA
# points the runs at another corpus), TIME_LIMIT (0 = none; else the runs' deadline is the script's
# start + TIME_LIMIT seconds: each run then gets SIGTERM, saves checkpoint_last and exits 75, and is
# killed 20 s later if it has not), PYTHON (default python, else python3), TRANSFORMER_DATA_DIR
# (folder holding multi30k/).
# DEVICE=auto records train.device=auto, as the CPU runs did, and still trains on the GPU there.
# Logs: $OUT/logs/*.log; runs: $OUT/ladder/<step>_seed<n>/, $OUT/length/<position>_seed<n>/,
# $OUT/wu2021_tiny/seed<n>/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_$(date +%Y-%m-%d_%H-%M-%S)}
DEVICE=${DEVICE:-cuda}
SEEDS=${SEEDS:-"1 2"}
STEPS=${STEPS-"step0_vaswani2017 step1_pre_ln step2_rmsnorm step3_swiglu step4_rope step5_gqa step6_decoder_only"}
LENGTH=${LENGTH:-}
WU=${WU:-1}
WU_SEEDS=${WU_SEEDS:-1}
EXTRA=${EXTRA:-}
PREPROCESS=${PREPROCESS:-1}
TIME_LIMIT=${TIME_LIMIT:-0}
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
mkdir -p "$OUT/logs"
start=$(date +%s)
deadline=$(( TIME_LIMIT > 0 ? start + TIME_LIMIT : 0 ))
echo "results_gpu.sh: device $DEVICE, steps: ${STEPS:-none}; length study: ${LENGTH:-none}; seeds: $SEEDS; Wu runs: $WU (seeds $WU_SEEDS); out $OUT; time limit ${TIME_LIMIT}s" >&2

# 1. Binarize each corpus once: the concurrent runs below then only map the cached arrays.
if [ "$PREPROCESS" = 1 ]; then
  for data in multi30k_en_de multi30k_tok_en_de; do
    "$PYTHON" scripts/preprocess.py "data=$data" > "$OUT/logs/preprocess_$data.log" 2>&1
  done
fi

# 2. One process per run, all on $DEVICE (one CPU thread each, as the experiments pin: the device
# does the arithmetic). With TIME_LIMIT, `timeout` sends SIGTERM at the deadline: the run stops
# politely (train.stop_signals) after the update in progress, with its checkpoint_last saved.
common=("train.device=$DEVICE" train.progress=false)
pids=()
names=()
launch() {  # launch <name> <log> <overrides...>
  local name=$1 log=$2
  shift 2
  local limit=()
  if [ "$deadline" -gt 0 ]; then
    local left=$(( deadline - $(date +%s) ))
    if [ "$left" -le 0 ]; then
      echo "not started (TIME_LIMIT reached): $name" >&2
      return
    fi
    limit=(timeout -s TERM -k 20 "$left")  # killed 20 s after SIGTERM if it has not stopped by then
  fi
  # shellcheck disable=SC2086  # EXTRA is a list of overrides
  OMP_NUM_THREADS=1 ${limit[@]+"${limit[@]}"} "$PYTHON" scripts/train.py "$@" "${common[@]}" $EXTRA > "$log" 2>&1 &
  pids+=($!)
  names+=("$name")
}
for step in $STEPS; do
  for seed in $SEEDS; do
    launch "ladder ${step} seed $seed" "$OUT/logs/ladder_${step}_seed$seed.log" \
      experiment=ladder "ladder=$step" "seed=$seed" "hydra.run.dir=$OUT/ladder/${step}_seed$seed"
  done
done
for position in $LENGTH; do
  for seed in $SEEDS; do
    launch "length ${position} seed $seed" "$OUT/logs/length_${position}_seed$seed.log" \
      experiment=length ladder=step5_gqa "model/position=$position" "seed=$seed" "hydra.run.dir=$OUT/length/${position}_seed$seed"
  done
done
if [ "$WU" = 1 ]; then
  for seed in $WU_SEEDS; do
    launch "wu2021_tiny seed $seed" "$OUT/logs/wu2021_tiny_seed$seed.log" \
      experiment=wu2021_tiny "seed=$seed" "hydra.run.dir=$OUT/wu2021_tiny/seed$seed"
  done
fi

failed=0
stopped=0
for i in "${!pids[@]}"; do
  status=0
  wait "${pids[$i]}" || status=$?
  if [ "$status" -eq 0 ]; then
    continue
  elif [ "$status" -eq 124 ] || [ "$status" -eq 75 ]; then  # timeout's status / the polite stop's
    echo "stopped by TIME_LIMIT: ${names[$i]} (checkpoint_last saved; rerun with OUT=$OUT to continue)" >&2
    stopped=$((stopped + 1))
  else
    echo "FAILED (exit $status): ${names[$i]} (see $OUT/logs)" >&2
    failed=$((failed + 1))
  fi
done
echo "${#pids[@]} runs in $(( $(date +%s) - start )) s: $failed failed, $stopped stopped by TIME_LIMIT" >&2

# 3. The ladder table (BLEU mean +- std over seeds, paired bootstrap), from every finished run.
if compgen -G "$OUT/ladder/*" > /dev/null; then
  if "$PYTHON" scripts/compare.py "$OUT"/ladder/* --out "$OUT/ladder_comparison" --baseline step0 > "$OUT/logs/compare.log" 2>&1; then
    echo "results: $OUT/ladder_comparison/comparison.md" >&2
  else
    echo "compare.py failed (see $OUT/logs/compare.log; no finished run yet?)" >&2
  fi
fi
if [ "$WU" = 1 ]; then
  for seed in $WU_SEEDS; do echo "results: $OUT/wu2021_tiny/seed$seed/results.json" >&2; done
fi
if [ -n "$LENGTH" ]; then
  echo "results: $OUT/length/*/results.json (compare with the CPU runs: scripts/compare.py docs/results/length/runs $OUT/length/* ...)" >&2
fi
exit $(( failed > 0 ))
