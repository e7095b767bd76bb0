#!/usr/bin/env bash
# bench/threads.sh: Parallax against PyTorch on the same GPT (d_model 256, 4 layers,
# vocabulary 1024, 64 tokens, 8 samples per rank, AdamW, clip 1.0, fp32), the same
# batches and the same initial weights (written once by bench_zero_step, loaded by the
# peer), on the same LibTorch and BLAS (Debian's 1.13 with OpenBLAS on both sides: the
# thread settings below are OpenBLAS's; bench/zero.sh, tp.sh and pipeline.sh face
# PyTorch 2.11): one process under the thread settings a user may have in the
# environment, then data parallelism on 2 and 4 ranks (bench_zero_step against
# bench/peers/torch_zero.py --mode ddp). Runs alternate between the two, REPEAT times;
# each cell is the median of the runs' median step times, printed with the ratio
# Parallax / PyTorch, and (where perf can count syscalls) the sched_yield calls of one
# single-process run, the sign of thread pools spinning against each other.
#
#   bench/threads.sh [--set key.path=value]...
#
# Environment: BUILD_DIR (build), REPEAT (3), STEPS (12; the first 2 are warm-up),
# PYTHON (a python3 that imports torch; default: the first of /usr/bin/python3 and
# python3 that does), RUN_TIMEOUT_S (600 per run). Uses the normal allocator.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
PARALLAX_DEB_PACKAGES+=(python3-torch linux-perf)
ensure_dependencies

BUILD_DIR="${BUILD_DIR:-build}"
REPEAT="${REPEAT:-3}"
STEPS="${STEPS:-12}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-600}"
MODEL=(--set model.d_model=256 --set model.n_layer=4 --set model.vocab_size=1024 --set model.block_size=64
  --set train.micro_batch_size=8 --set train.grad_accum=1)  # global batch: 8 per rank
ARGS=(--config configs/gpt_base.toml --set "train.steps=$STEPS" --set logging.every=0 "${MODEL[@]}" "$@")
BENCH="$(bench_binary bench_zero_step)"
PYTHON_TORCH="$(python_with_torch)"
[[ -n "$PYTHON_TORCH" ]] || { echo "error: no python3 here imports torch (apt-get install python3-torch)" >&2; exit 1; }
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/bench_threads.XXXXXX")"
WEIGHTS="$LOGS/initial_weights.pt"
OMP_NUM_THREADS=1 timeout "$RUN_TIMEOUT_S" "$BENCH" "${ARGS[@]}" --set train.global_batch_size=8 --set train.steps=3 \
  --write-initial-weights "$WEIGHTS" >"$LOGS/weights.log" 2>&1 ||
  { echo "error: writing the initial weights failed (log: $LOGS/weights.log)" >&2; exit 1; }

# median_ms RANKS ENV... -- COMMAND...: one run's median step time (ms), or "failed".
median_ms() {
  local ranks=$1 log="$LOGS/run.$RANDOM.log"
  shift
  local env=()
  while [[ "$1" != "--" ]]; do env+=("$1"); shift; done
  shift
  if env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "${env[@]}" timeout "$RUN_TIMEOUT_S" \
      mpirun -np "$ranks" --oversubscribe --bind-to none "$@" >"$log" 2>&1; then
    grep -m1 '^{"impl"' "$log" | sed -E 's/.*"median_step_ms": ([0-9.]+).*/\1/'
  else
    echo "failed"
  fi
}

median_of() { tr ' ' '\n' | awk 'NF' | sort -g | awk '{v[NR]=$1} END {print (NR ? v[int((NR+1)/2)] : "n/a")}'; }

# sched_yield calls of one single-process Parallax run under ENV..., when perf can count them.
yields() {
  if perf stat -e syscalls:sys_enter_sched_yield -x, -o "$LOGS/perf.txt" -- true >/dev/null 2>&1; then
    env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "$@" perf stat -e syscalls:sys_enter_sched_yield -x, \
      -o "$LOGS/perf.txt" -- "$BENCH" "${ARGS[@]}" --set train.global_batch_size=8 >/dev/null 2>&1 || true
    awk -F, '/sched_yield/ {print $1}' "$LOGS/perf.txt"
  else
    echo "-"
  fi
}

printf "%-40s %6s %12s %12s %8s %14s\n" "setting" "ranks" "parallax ms" "pytorch ms" "ratio" "sched_yield"
row() {
  local ranks=$1
  shift
  local label="${*:-(no thread variables)}" ours="" theirs=""
  local batch=(--set "train.global_batch_size=$((8 * ranks))")
  for ((i = 0; i < REPEAT; ++i)); do
    ours+=" $(median_ms "$ranks" "$@" -- "$BENCH" "${ARGS[@]}" "${batch[@]}")"
    theirs+=" $(median_ms "$ranks" "$@" -- "$PYTHON_TORCH" bench/peers/torch_zero.py --mode ddp \
      --rendezvous "$LOGS/rdzv.$RANDOM" --initial-weights "$WEIGHTS" "${ARGS[@]}" "${batch[@]}")"
  done
  local a b y="-"
  a="$(median_of <<<"${ours//failed/}")"
  b="$(median_of <<<"${theirs//failed/}")"
  ((ranks == 1)) && y="$(yields "$@")"
  printf "%-40s %6d %12s %12s %8s %14s\n" "$label" "$ranks" "$a" "$b" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }')" "$y"
}

row 1 OMP_NUM_THREADS=1
row 1 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1
row 1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=2
row 1 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
row 2
row 4
echo "(median of $REPEAT alternating runs' median step times; $(nproc) cores; Parallax sizes its own pools:"
echo " PyTorch runs torch.set_num_threads(1), as the peer always has; logs in $LOGS)"
