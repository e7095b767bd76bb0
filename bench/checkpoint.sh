#!/usr/bin/env bash
# bench/checkpoint.sh: what a checkpoint costs the training loop. The GPT example (4
# ranks, d_model 384 × 6 layers, vocabulary 4096, ZeRO-1: each rank owns a quarter of
# the fp32 masters and Adam moments) trains 12 steps saving every 4, once with
# synchronous saves and once with checkpoint.async = true, into a directory under
# $TMPDIR. For each mode: the training loop's blocked time per save (median), the bytes
# each rank wrote, the save's wall time on rank 0 and its write rate (all ranks' bytes
# over that time) against this disk's sequential write rate measured in the same run
# (one file of the same total size, written and fsynced by one process).
#
#   bench/checkpoint.sh [--set key.path=value]...
#
# Environment: TORCH (debian), BUILD_DIR (TORCH's; configured and train_gpt built only
# when the directory does not exist), RANKS (4), RUN_TIMEOUT_S (600).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_dependencies

RANKS="${RANKS:-4}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-600}"
TRAIN="$(train_gpt_binary)"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/bench_checkpoint.XXXXXX")"
ARGS=(--config configs/gpt_base.toml --set model.d_model=384 --set model.n_layer=6 --set model.vocab_size=4096
  --set zero.stage=1 --set train.steps=12 --set logging.every=0 --set checkpoint.every=4 --set checkpoint.keep=0 "$@")

for mode in sync async; do
  echo "running $mode ..." >&2
  timeout "$RUN_TIMEOUT_S" mpirun -np "$RANKS" --oversubscribe --bind-to none "$TRAIN" "${ARGS[@]}" \
    --set "checkpoint.dir=\"$LOGS/$mode\"" --set "checkpoint.async=$([[ $mode == async ]] && echo true || echo false)" \
    >"$LOGS/$mode.log" 2>&1 || { echo "error: the $mode run failed (log: $LOGS/$mode.log)" >&2; exit 1; }
done

# This disk's sequential write rate: one file the size of a checkpoint, fsynced.
bytes=$(find "$LOGS/sync" -name 'rank-*.bin' -path '*step-000000000004*' -printf '%s\n' | awk '{s += $1} END {print s}')
disk_mbps=$(python3 - "$LOGS/disk_rate.bin" "$bytes" <<'PY'
import os, sys, time
path, total = sys.argv[1], int(sys.argv[2])
block = b"\x5a" * (4 << 20)
start = time.perf_counter()
with open(path, "wb") as out:
    written = 0
    while written < total:
        written += out.write(block[: min(len(block), total - written)])
    out.flush()
    os.fsync(out.fileno())
print(f"{total / (time.perf_counter() - start) / 1e6:.1f}")
os.remove(path)
PY
)

echo
echo "GPT example (d_model 384 x 6, vocabulary 4096), $RANKS ranks, ZeRO-1, 12 steps saving every 4 ($bytes bytes per"
echo "checkpoint); this disk writes ${disk_mbps} MB/s sequentially (one file of that size, fsynced)"
printf "%-6s %6s %17s %16s %12s %12s %10s\n" "mode" "saves" "blocked ms/save" "bytes/rank max" "save s" "write MB/s" "vs disk"
for mode in sync async; do
  per_rank=$(find "$LOGS/$mode" -name 'rank-*.bin' -path '*step-000000000004*' -printf '%s\n' | sort -n | tail -1)
  # Blocked: the sync lines' "training blocked X ms", the async lines' "(training blocked X ms)".
  # Save time: the "saved ... save S s" lines (rank 0), in both modes.
  awk -v mode="$mode" -v bytes="$bytes" -v per_rank="$per_rank" -v disk="$disk_mbps" '
    function median(v, n,    i, j, x) {
      for (i = 2; i <= n; ++i) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; --j) v[j + 1] = v[j]; v[j + 1] = x }
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    /training blocked/ { match($0, /training blocked [0-9.e+-]+ ms/); b[++nb] = substr($0, RSTART + 17, RLENGTH - 20) + 0 }
    /# checkpoint: saved/ { match($0, /save [0-9.e+-]+ s/); t[++nt] = substr($0, RSTART + 5, RLENGTH - 7) + 0 }
    END {
      s = median(t, nt); rate = bytes / s / 1e6
      printf "%-6s %6d %17.1f %16d %12.3f %12.1f %10.2f\n", mode, nt, median(b, nb), per_rank, s, rate, rate / disk
    }' "$LOGS/$mode.log"
done
echo "(blocked: the training loop's wait per save, the median; async blocks only to copy the state to host memory"
echo " and to wait for the previous save; save s: rank 0's whole save protocol, the median; write MB/s: one"
echo " checkpoint's bytes over that time; logs in $LOGS)"
