#!/usr/bin/env bash
# Soak: trains the GPT example for STEPS steps (default 2000) in each of two cells and
# watches every rank for what a long job leaks. Builds train_gpt if needed.
#   zero3-nvme  ZeRO-3 over 2 ranks, optimizer state and parameters on the NVMe tier
#               (configs/dp.toml with offload.optimizer = offload.param = "nvme")
#   pipeline    configs/pp.toml: 1F1B over 2 stages, 8 micro-batches per step
# Both with a constant learning rate, so a run's losses do not depend on train.steps.
#
# Per cell:
#   a. a short run of SHORT steps (default 200); its losses are the reference;
#   b. the long run, sampled twice a second: each rank's resident memory (VmRSS), thread
#      count and open file descriptors (/proc/PID), against the step rank 0's metrics
#      file has reached;
#   c. verdict, over the samples after the first quarter of the steps (warm-up:
#      allocator pools, the tier's buffers): the descriptors and threads of every rank
#      never change, the resident memory's least-squares slope stays under
#      SLOPE_LIMIT_KB (default 1024) per 1000 steps, and the long run's losses at steps
#      1..SHORT equal the short run's digit for digit.
# Prints one [ figures  ] line per rank and cell, and exits non-zero on any failed check.
#
#   scripts/soak.sh [STEPS [SHORT]]        e.g. scripts/soak.sh 2000 200
#   CELLS=pipeline scripts/soak.sh 500     one cell
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source tests/rank_of_pid.sh
STEPS="${1:-2000}"
SHORT="${2:-200}"
SLOPE_LIMIT_KB="${SLOPE_LIMIT_KB:-1024}"
read -r -a CELLS <<<"${CELLS:-zero3-nvme pipeline}"

ensure_dependencies
configure_and_build -- --target train_gpt
prefer_cpu_openblas_kernels
TRAIN_GPT="$BUILD_DIR/examples/train_gpt"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/soak.XXXXXX")"
trap '[[ -n "${SOAK_KEEP:-}" ]] || rm -rf "$WORK"' EXIT
failures=0
RANKS=2

cell_args() {
  case "$1" in
    zero3-nvme)
      mkdir -p "$WORK/nvme"
      echo --config configs/dp.toml --set zero.stage=3 --set offload.optimizer=\"nvme\" \
        --set offload.param=\"nvme\" --set "offload.nvme_path=\"$WORK/nvme\""
      ;;
    pipeline) echo --config configs/pp.toml ;;
    *)
      echo "soak.sh: unknown cell $1 (zero3-nvme, pipeline)" >&2
      exit 2
      ;;
  esac
}

# train CELL STEPS METRICS: one run in the background; sets JOB.
train() {
  local -a args
  read -r -a args <<<"$(cell_args "$1")"
  mpirun --oversubscribe --bind-to none -np "$RANKS" "$TRAIN_GPT" "${args[@]}" --set "train.steps=$2" \
    --set 'scheduler.type="constant"' --set logging.every=0 --set "logging.metrics_file=\"$3\"" \
    >"$3.log" 2>&1 &
  JOB=$!
}

# sample PID STEP: "STEP RANK RSS_KB THREADS FDS" for a rank still running, else nothing.
sample() {
  local rank rss threads fds
  rank=$(rank_of_pid "$1") || return 0
  rss=$(sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status" 2>/dev/null) || return 0
  threads=$(sed -n 's/^Threads:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null) || return 0
  fds=$(find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  [[ -n "$rank" && -n "$rss" && -n "$threads" ]] && echo "$2 $rank $rss $threads $fds"
  return 0
}

# losses METRICS N: step and loss of the first N lines, as printed.
losses() { head -n "$2" "$1" | sed -E 's/.*"step":([0-9]+).*"loss":([^,}]+).*/\1 \2/'; }

for cell in "${CELLS[@]}"; do
  train "$cell" "$SHORT" "$WORK/$cell-short.jsonl"
  wait "$JOB" || { echo "FAIL $cell: the short run failed:"; tail -20 "$WORK/$cell-short.jsonl.log"; exit 1; }

  train "$cell" "$STEPS" "$WORK/$cell.jsonl"
  samples="$WORK/$cell.samples"  # step rank rss_kb threads fds
  : >"$samples"
  started=$SECONDS
  while kill -0 "$JOB" 2>/dev/null; do
    step=$( (wc -l <"$WORK/$cell.jsonl") 2>/dev/null || echo 0)
    for pid in $(pgrep -x train_gpt); do sample "$pid" "$step" >>"$samples" || true; done
    sleep 0.5
  done
  wait "$JOB" || { echo "FAIL $cell: the long run failed:"; tail -20 "$WORK/$cell.jsonl.log"; failures=$((failures + 1)); continue; }
  took=$((SECONDS - started))

  if ! diff <(losses "$WORK/$cell-short.jsonl" "$SHORT") <(losses "$WORK/$cell.jsonl" "$SHORT") >"$WORK/diff"; then
    echo "FAIL $cell: the long run's losses differ from the short run's at the same steps:"
    head -5 "$WORK/diff"
    failures=$((failures + 1))
  fi
  # Per rank, after the warm-up: the slope of RSS against step (least squares), the range
  # of RSS, and whether threads and descriptors held still.
  report="$(awk -v ranks="$RANKS" -v warm=$((STEPS / 4)) -v steps="$STEPS" -v limit="$SLOPE_LIMIT_KB" '
    $1 >= warm && $1 < steps {
      r = $2; n[r]++; sx[r] += $1; sy[r] += $3; sxx[r] += $1 * $1; sxy[r] += $1 * $3
      if (!(r in lo) || $3 < lo[r]) lo[r] = $3
      if (!(r in hi) || $3 > hi[r]) hi[r] = $3
      if (!(r in t0)) { t0[r] = $4; f0[r] = $5 }
      if ($4 != t0[r]) tmove[r] = tmove[r] " " t0[r] "->" $4
      if ($5 != f0[r]) fmove[r] = fmove[r] " " f0[r] "->" $5
    }
    END {
      bad = 0
      for (r = 0; r < ranks; r++) if (!(r in n)) { printf "rank %d: no samples after the warm-up: FAIL\n", r; bad = 1 }
      for (r in n) {
        d = n[r] * sxx[r] - sx[r] * sx[r]
        slope = (n[r] > 2 && d > 0) ? (n[r] * sxy[r] - sx[r] * sy[r]) / d * 1000 : 0
        verdict = "flat"
        if (n[r] < 5) { verdict = "FAIL: " n[r] " samples"; bad = 1 }
        if (slope > limit) { verdict = "FAIL: RSS grows"; bad = 1 }
        if (tmove[r] != "") { verdict = "FAIL: threads" tmove[r]; bad = 1 }
        if (fmove[r] != "") { verdict = "FAIL: descriptors" fmove[r]; bad = 1 }
        printf "rank %s: RSS %+.0f KB per 1000 steps (%d..%d KB over %d samples), %d threads, %d fds: %s\n",
          r, slope, lo[r], hi[r], n[r], t0[r], f0[r], verdict
      }
      exit bad
    }' "$samples")" || failures=$((failures + 1))
  while read -r line; do
    printf '[ figures  ] soak %-10s %d steps in %d s | %s\n' "$cell" "$STEPS" "$took" "$line"
  done <<<"$report"
  printf '[ figures  ] soak %-10s losses at steps 1..%d equal the %d-step run'"'"'s: %s\n' "$cell" "$SHORT" "$SHORT" \
    "$([[ -s "$WORK/diff" ]] && echo no || echo yes)"
done
exit "$failures"
