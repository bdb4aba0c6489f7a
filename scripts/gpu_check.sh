#!/usr/bin/env bash
# The ONE prepared command for a GPU machine, from the repository root:
#
#   bash scripts/gpu_check.sh
#
# 1. a preflight (GPU, python, packages, Multi30k) into $OUT/preflight.txt: what is missing is said
#    there, before anything runs;
# 2. python -m benchmarks.gpu_check --device cuda into $OUT/gpu_check/, under a hard cap of CHECK_S
#    seconds (its own budget is CHECK_S - 40; what does not fit is recorded as skipped, with why):
#    first Trainer.train_step itself (transformer_2017_base, 16k-token WMT-like batches, its data
#    path, eager / compiled / DDP over a 1-rank group: tokens/s, ms per update, MFU, compile time),
#    then the compiled trainer against the CPU (training_compile), then the realistic-size table
#    (transformer_2017_base / big and a ~100M llama_style, bf16, 8k/16k/32k-token Multi30k-like
#    batches, eager / compiled / CUDA graphs, ours beside HF Marian / HF Llama; beam-5 and greedy
#    decoding beside HF generate and CTranslate2), then training fp32/bf16 against the CPU, decoding
#    parity and the SDPA backends;
# 3. with STUDY=1 and the time left of TOTAL_S (at least 90 s): scripts/results_gpu.sh (the ladder x 2 seeds and
#    the Wu et al. run, fp32 as the ladder pins, so comparable with the CPU runs) with
#    TIME_LIMIT = what is left, its run folders in $WORK/study; then the small files of every run
#    (metrics.jsonl, results.json, config.yaml, train.log, hyps/, logs, the ladder table) are copied
#    to $OUT/study/ and summarised (updates reached, tokens/s, BLEU) in $OUT/study/study_progress.md.
#    One session's device time does not finish the study (6000 updates per run); the summary shows
#    how far it got, and rerunning with the same WORK continues every run (train.resume=auto).
#
# Everything goes under one folder, $OUT (default runs/gpu_<date>; on the device tool, the folder
# that comes back), and every file names the device: copy $OUT/gpu_check/ to docs/benchmarks/gpu/
# and $OUT/study/ to docs/results/gpu/ to commit them beside the CPU results. The exit status is the
# check's (0: every section passed or was skipped; 1: one failed; 124: cut by CHECK_S), 2 at preflight.
#
# Environment: OUT, WORK (checkpoints, caches: default runs/gpu_work, not copied), TOTAL_S (default
# 540: a 600 s device command with a minute spare), CHECK_S (default 360: the check alone leaves a
# 15-minute device session the time for a second call, a rerun with --skip of what ran), CHECK (0:
# skip step 2), STUDY (default 0; 1: step 3), CHECK_ARGS (e.g. "--skip trainer training_compile" for
# the rerun), PYTHON (default python, else python3), TRANSFORMER_DATA_DIR (else
# shared/data or ../shared/data), WHEELS (a folder of wheels: missing packages are installed from
# it with pip --no-index, default shared/wheels); for a smoke run on a CPU: DEVICE (default cuda),
# CHECK_ARGS (more arguments of the check, e.g. --quick) and results_gpu.sh's own variables (STEPS,
# SEEDS, WU, PREPROCESS, EXTRA), which it inherits.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_$(date +%Y-%m-%d_%H-%M-%S)}
WORK=${WORK:-runs/gpu_work}
TOTAL_S=${TOTAL_S:-540}
CHECK_S=${CHECK_S:-360}
CHECK=${CHECK:-1}
STUDY=${STUDY:-0}
WHEELS=${WHEELS:-shared/wheels}
DEVICE=${DEVICE:-cuda}
CHECK_ARGS=${CHECK_ARGS:-}
PYTHON=${PYTHON:-$(command -v python || command -v python3 || echo python3)}
start=$(date +%s)
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/gpu_check_sh.log") 2>&1
elapsed() { echo $(( $(date +%s) - start )); }

# ---------------------------------------------------------------- 1. preflight
for d in "${TRANSFORMER_DATA_DIR:-}" shared/data ../shared/data; do
  if [ -n "$d" ] && [ -f "$d/multi30k/train.en.gz" ]; then
    TRANSFORMER_DATA_DIR=$(cd "$d" && pwd -P)
    export TRANSFORMER_DATA_DIR
    break
  fi
done
preflight() {
  echo "gpu_check.sh preflight, $(date -Iseconds), host $(hostname), repo $(pwd), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -3)"
  echo "python: $PYTHON ($("$PYTHON" --version 2>&1))"
  "$PYTHON" - <<'EOF'
import importlib.util
need = {"torch": "torch", "numpy": "numpy", "hydra": "hydra-core", "omegaconf": "omegaconf", "einops": "einops",
        "sentencepiece": "sentencepiece", "sacrebleu": "sacrebleu", "safetensors": "safetensors", "tqdm": "tqdm"}
optional = {"transformers": "transformers", "triton": "triton", "matplotlib": "matplotlib"}
missing = [d for m, d in need.items() if importlib.util.find_spec(m) is None]
print("MISSING required packages: " + " ".join(missing) if missing else "required packages: all present")
print("missing optional packages: " + (" ".join(d for m, d in optional.items() if importlib.util.find_spec(m) is None) or "none"))
if importlib.util.find_spec("torch"):
    import torch
    ok = torch.cuda.is_available()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {ok}"
          + (f", device: {torch.cuda.get_device_name(0)}" if ok else " (no GPU visible to torch)"))
EOF
  echo "Multi30k: ${TRANSFORMER_DATA_DIR:-MISSING (set TRANSFORMER_DATA_DIR, or copy the data folder to shared/data)}"
}
preflight | tee "$OUT/preflight.txt"
missing=$(grep '^MISSING required packages: ' "$OUT/preflight.txt" | sed 's/^MISSING required packages: //')
if [ -n "$missing" ] && [ -d "$WHEELS" ]; then
  echo "installing from $WHEELS: $missing"
  # shellcheck disable=SC2086  # a list of distributions
  "$PYTHON" -m pip install --no-index --find-links "$WHEELS" $missing 2>&1 | tail -3
  preflight | tee "$OUT/preflight.txt"
  missing=$(grep '^MISSING required packages: ' "$OUT/preflight.txt" | sed 's/^MISSING required packages: //')
fi
if [ -n "$missing" ]; then
  echo "gpu_check.sh: stopping: required packages missing ($missing); see $OUT/preflight.txt"
  exit 2
fi

# ---------------------------------------------------------------- 2. the GPU check
if [ "$CHECK" = 1 ]; then
  # shellcheck disable=SC2086  # CHECK_ARGS is a list of arguments
  timeout -s TERM -k 20 "$CHECK_S" "$PYTHON" -m benchmarks.gpu_check --device "$DEVICE" --out "$OUT/gpu_check" \
    --work "$WORK/gpu_check" --budget-s $(( CHECK_S - 40 )) $CHECK_ARGS
  check_status=$?
  echo "benchmarks.gpu_check: exit $check_status after $(elapsed) s (0: every section passed; 1: one failed; 124: cut by CHECK_S)"
fi

# ---------------------------------------------------------------- 3. the study, with the time left
left=$(( TOTAL_S - $(elapsed) - 60 ))  # 60 s kept for the polite stops (killed 20 s after SIGTERM), the copy, the summary
if [ "$STUDY" = 1 ] && [ "$left" -ge 90 ]; then
  OUT="$WORK/study" DEVICE=$DEVICE TIME_LIMIT=$left PYTHON="$PYTHON" bash scripts/results_gpu.sh
  echo "results_gpu.sh: exit $? after $(elapsed) s"
  mkdir -p "$OUT/study"
  (cd "$WORK/study" && find . -type f \( -name metrics.jsonl -o -name results.json -o -name config.yaml \
      -o -name train.log -o -name '*.log' -o -path '*/hyps/*' -o -path './ladder_comparison/*' \) -print0 \
    | xargs -0 -r cp --parents -t "$OUT/study")
  "$PYTHON" -m benchmarks.gpu_check --study-summary "$WORK/study" --out "$OUT/study" \
    --study-note "scripts/results_gpu.sh with TIME_LIMIT=${left}s after the GPU check (one device session)" \
    || echo "study summary failed"
elif [ "$STUDY" = 1 ]; then
  echo "results_gpu.sh: not started, ${left} s left of TOTAL_S=$TOTAL_S (needs 90)"
fi
echo "gpu_check.sh: done in $(elapsed) s; everything is in $OUT"
exit "${check_status:-0}"  # the check's status: the study runs after a failed check, but the session sees it
