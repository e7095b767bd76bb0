#!/usr/bin/env bash
# bench/pipeline.sh: pipeline bubbles of every schedule (gpipe, 1f1b, interleaved with 2
# chunks, zb-h1) measured on 2 ranks with one thread each for m = 2, 4, 8, 16
# micro-batches, against (p−1)/(m+p−1) and against the same schedule simulated with this
# machine's per-layer times; then the simulated table for p = 4 and 8 (bench_pipeline).
#
#   bench/pipeline.sh [STEPS]          measured steps per case after 2 warm-up (default 6)
#
# Environment: BUILD_DIR (default build; configured and bench_pipeline built only when
# the directory does not exist), RUN_TIMEOUT_S (900).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_dependencies

BUILD_DIR="${BUILD_DIR:-build}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-900}"
BENCH="$(bench_binary bench_pipeline)"
timeout "$RUN_TIMEOUT_S" mpirun -np 2 --oversubscribe --bind-to none "$BENCH" "${1:-6}"
