#!/usr/bin/env bash
# bench/moe.sh: one mixture-of-experts layer (forward and backward) with its experts over
# ep = 2 and 4 ranks, against every expert on every rank, in the same run
# (bench_moe_layer; its header says how each is timed); beside it the PyTorch 2.11 peer
# on the same shapes and timing (bench/peers/torch_moe.py: torchtitan's approach written
# with torch.distributed's all-to-all over gloo). Ratios are Parallax's time over the
# peer's, both measured in this run.
#   bench/moe.sh [flags for both; default --iters 11, e.g. --tokens 2048 --experts 16]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_torch_wheel  # the peer's PyTorch 2.11, whichever LibTorch Parallax uses
bench=$(bench_binary bench_moe_layer)
flags=("$@")
((${#flags[@]})) || flags=(--iters 11)
for np in 2 4; do
  ours=$(mpirun --oversubscribe --bind-to none -np "$np" "$bench" "${flags[@]}")
  peer=$(mpirun --oversubscribe --bind-to none -np "$np" "$PARALLAX_TORCH_VENV/bin/python" bench/peers/torch_moe.py \
    "${flags[@]}")
  echo "$ours"
  echo "$peer"
  # "parallax ep = N  ms ...", "every expert on every rank  ms ...", "torch ep = N  ms",
  # "torch every expert on every rank  ms".
  awk -v ours="$(awk '/^parallax ep/ {print $5}' <<<"$ours")" \
      -v replicated="$(awk '/^every expert/ {print $6}' <<<"$ours")" '
    /^torch ep/ { printf "Parallax ep / torch ep: %.2fx the time\n", ours / $5 }
    /^torch every expert/ { printf "Parallax every expert / torch every expert: %.2fx the time\n", replicated / $7 }
  ' <<<"$peer"
  echo
done
