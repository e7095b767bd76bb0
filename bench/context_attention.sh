#!/usr/bin/env bash
# bench/context_attention.sh: one causal attention layer (forward and backward) split over
# cp = 2 and 4 ranks by ring attention (load-balanced and contiguous) and all-to-all,
# against the same layer on the whole sequence in one process, in the same run
# (bench_context_attention; its header says how each is timed). Beside each, the PyTorch
# 2.11 peers on the same shapes and timing (bench/peers/torch_cp_attention.py): Ulysses
# written with torch.distributed's all-to-all (with Parallax's attention math, and with
# SDPA's CPU kernel), and torch's experimental context_parallel (ring), which runs CUDA
# attention kernels only and says so. Ratios are Parallax's time over the peer's, both
# measured in this run.
#   bench/context_attention.sh [flags for both; default --iters 11, e.g. --seq 4096 --iters 15]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_torch_wheel  # the peers' PyTorch 2.11, whichever LibTorch Parallax uses
bench=$(bench_binary bench_context_attention)
flags=("$@")
((${#flags[@]})) || flags=(--iters 11)  # medians of 11: this shared machine's noise is ±15% over 5
for np in 2 4; do
  ours=$(mpirun --oversubscribe --bind-to none -np "$np" "$bench" "${flags[@]}")
  peers=$(mpirun --oversubscribe --bind-to none -np "$np" "$PARALLAX_TORCH_VENV/bin/python" \
    bench/peers/torch_cp_attention.py "${flags[@]}")
  echo "$ours"
  echo "$peers"
  # Each Parallax method over each torch all-to-all row: milliseconds per layer.
  awk -v ring="$(awk '/^ring, load-balanced/ {print $3}' <<<"$ours")" \
      -v a2a="$(awk '/^all-to-all/ {print $2}' <<<"$ours")" '
    /^torch all-to-all/ {
      peer = $1 " " $2 " " $3
      printf "Parallax ring, load-balanced / %s: %.2fx the time\n", peer, ring / $4
      printf "Parallax all-to-all / %s: %.2fx the time\n", peer, a2a / $4
    }' <<<"$peers"
  echo
done
