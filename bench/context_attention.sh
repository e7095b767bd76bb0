#!/usr/bin/env bash
# bench/context_attention.sh: one causal attention layer (forward and backward) split over
# cp = 2 and 4 ranks by ring attention (load-balanced and contiguous) and all-to-all,
# against the same layer on the whole sequence in one process, in the same run
# (bench_context_attention; its header says how each is timed).
#   bench/context_attention.sh [bench_context_attention flags, e.g. --seq 4096]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
bench=$(bench_binary bench_context_attention)
for np in 2 4; do
  mpirun --oversubscribe --bind-to none -np "$np" "$bench" "$@"
  echo
done
