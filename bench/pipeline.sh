#!/usr/bin/env bash
# bench/pipeline.sh: pipeline bubbles of every schedule (gpipe, 1f1b, interleaved with 2
# chunks, zb-h1) measured on 2 ranks with one thread each for m = 2, 4, 8, 16
# micro-batches, against (p−1)/(m+p−1) and against the same schedule simulated with this
# machine's per-layer times; then the simulated table for p = 4 and 8 (bench_pipeline).
# Then the GPT example's pipeline (configs/pp.toml: pp = 2, 8 micro-batches, the uniform
# partition) under gpipe, 1f1b, interleaved (2 chunks) and zb-h1 beside PyTorch 2.11's
# torch.distributed.pipelining on the same cut (bench/peers/torch_pp.py; zb-h1 against its
# ScheduleInterleavedZeroBubble with one chunk per rank), both from the initial weights
# bench_zero_step writes: median step time, peak RSS per rank (a separate 3-step run of
# each side), bytes communicated per rank per step (the largest rank; Parallax's from its
# metrics, PyTorch's counted in one extra step) and the largest relative difference of any
# step's loss. Parallax builds with TORCH=wheel by
# default, so both run LibTorch 2.11's kernels.
#
#   bench/pipeline.sh [STEPS]          measured steps per case after 2 warm-up (default 6)
#
# Environment: TORCH (wheel), BUILD_DIR (TORCH's; configured and the benches built only
# when the directory does not exist), PEER_STEPS (12 optimizer steps per run of the
# PyTorch comparison, the first 2 warm-up), RUN_TIMEOUT_S (900).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export TORCH="${TORCH:-wheel}"
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_dependencies
ensure_torch_wheel  # the peer's PyTorch 2.11, whichever LibTorch Parallax uses

RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-900}"
PEER_STEPS="${PEER_STEPS:-12}"
BENCH="$(bench_binary bench_pipeline)"
timeout "$RUN_TIMEOUT_S" mpirun -np 2 --oversubscribe --bind-to none "$BENCH" "${1:-6}"

WRITER="$(bench_binary bench_zero_step)"
TRAIN="$(train_gpt_binary)"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/bench_pipeline.XXXXXX")"
RESULTS="$LOGS/results"
MEMORY="$LOGS/memory"
: >"$RESULTS"
: >"$MEMORY"
WEIGHTS="$LOGS/initial_weights.pt"
RANKS=2
ARGS=(--config configs/pp.toml --set 'pipeline.partition="uniform"' --set logging.every=0)

# The same model unsplit (its layers are seeded alike), a few steps: the initial weights.
bench_run weights "$WRITER" "${ARGS[@]}" --set parallel.pp=1 --set train.steps=3 --write-initial-weights "$WEIGHTS"
for schedule in gpipe 1f1b interleaved zb-h1; do
  cut=(--set "pipeline.schedule=\"$schedule\"" --set "train.steps=$PEER_STEPS")
  [[ "$schedule" == interleaved ]] && cut+=(--set pipeline.virtual_stages=2)
  # train_gpt's metrics file (rank 0's step time, each step's loss, every rank's
  # counters) as one bench line.
  metrics="$LOGS/parallax-$schedule.jsonl"
  if timeout "$RUN_TIMEOUT_S" mpirun -np "$RANKS" --oversubscribe --bind-to none "$TRAIN" "${ARGS[@]}" "${cut[@]}" \
    --set "logging.metrics_file=\"$metrics\"" >"$LOGS/parallax-$schedule.log" 2>&1; then
    "$PARALLAX_TORCH_VENV/bin/python" - "$metrics" "$schedule" >>"$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
timed = rows[2:]
comm = [max(sum(op["bytes"] for op in rank.values()) for rank in row["comm"]) for row in timed]
print(f"parallax-{sys.argv[2]} " + json.dumps({
    "impl": "parallax", "median_step_ms": round(statistics.median(row["step_ms"] for row in timed), 3),
    "comm_bytes_per_step": [statistics.median(comm)], "losses": [row["loss"] for row in rows]}))
PY
  else
    echo "parallax-$schedule failed (log: $LOGS/parallax-$schedule.log)" >>"$RESULTS"
  fi
  bench_run "torch-$schedule" "$PARALLAX_TORCH_VENV/bin/python" bench/peers/torch_pp.py "${ARGS[@]}" "${cut[@]}" \
    --initial-weights "$WEIGHTS"
  # Peak RSS per rank, each side in a separate 3-step run (bench_peak_rss).
  bench_peak_rss "parallax-$schedule" "$TRAIN" "${ARGS[@]}" "${cut[@]}" --set train.steps=3
  bench_peak_rss "torch-$schedule" "$PARALLAX_TORCH_VENV/bin/python" bench/peers/torch_pp.py "${ARGS[@]}" "${cut[@]}" \
    --set train.steps=3 --initial-weights "$WEIGHTS"
done

echo
echo "GPT example, 2 ranks, configs/pp.toml (pp 2, 8 micro-batches, uniform partition), $PEER_STEPS steps: median step ms"
echo "after 2 warm-up, Parallax (TORCH=$TORCH) beside PyTorch $("$PARALLAX_TORCH_VENV/bin/python" -c 'import torch; print(torch.__version__)') torch.distributed.pipelining"
awk "$BENCH_AWK_FUNCTIONS"'
  function ratio(x, base) { return (x != "" && base > 0) ? sprintf("%.2f", x / base) : "n/a" }
  FILENAME == ARGV[1] {  # the memory runs: peak RSS by name
    rest = $0; sub(/^[^ ]+ /, "", rest)
    if (rest ~ /^\{/) memory[$1] = list_max(rest, "peak_rss_mib")
    next
  }
  { name = $1; rest = $0; sub(/^[^ ]+ /, "", rest); line[name] = rest }
  END {
    printf "%-12s %11s %9s %6s %11s %9s %6s %15s %13s %6s %9s\n", "schedule", "parallax ms", "torch ms", "ratio",
           "parallax MiB", "torch MiB", "ratio", "parallax B/step", "torch B/step", "ratio", "loss diff"
    split("gpipe 1f1b interleaved zb-h1", schedules, " ")
    for (k = 1; k <= 4; ++k) {
      s = schedules[k]; ours = line["parallax-" s]; theirs = line["torch-" s]
      if (ours !~ /^\{/ || theirs !~ /^\{/) { printf "%-12s %s | %s\n", s, ours, theirs; continue }
      a = field(ours, "median_step_ms"); b = field(theirs, "median_step_ms")
      ma = memory["parallax-" s]; mb = memory["torch-" s]
      ca = list_max(ours, "comm_bytes_per_step"); cb = list_max(theirs, "comm_bytes_per_step")
      set_reference_losses(ours)
      printf "%-12s %11.1f %9.1f %6s %11s %9s %6s %15.0f %13.0f %6s %9s\n", s, a, b, ratio(a, b),
             (ma == "" ? "n/a" : sprintf("%.1f", ma)), (mb == "" ? "n/a" : sprintf("%.1f", mb)), ratio(ma, mb), ca, cb,
             ratio(ca, cb), loss_gap(theirs)
    }
  }' "$MEMORY" "$RESULTS"
echo "(ratio: Parallax / PyTorch; Parallax's step time is rank 0's from its metrics file, PyTorch's the slowest"
echo " rank's; B/step: the largest rank's sends, receives and collectives per step, each counted by its buffer"
echo " (Parallax's include the shape headers it sends when shapes change); MiB: the largest rank's peak RSS in a"
echo " separate 3-step run of each side (MALLOC_MMAP_THRESHOLD_=65536, ru_maxrss of each rank's process, the"
echo " Python interpreter and its imports included on PyTorch's side); loss diff: the largest relative"
echo " difference of any step's loss; logs in $LOGS)"
