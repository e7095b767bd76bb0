#!/usr/bin/env bash
# bench/zero.sh: the GPT example on 4 ranks under ZeRO stages 0–3 (bench_zero_step), under
# ZeRO-Offload (stage 2 with the optimizer on the CPU; stage 3 with optimizer and
# parameters on the CPU, and on the NVMe tier under $TMPDIR) and, with the same model,
# batch and config, under PyTorch DDP and DDP + ZeroRedundancyOptimizer over gloo
# (bench/peers/torch_zero.py, PyTorch 2.11 from the wheel's virtual environment). Parallax
# builds against the same LibTorch 2.11 by default (TORCH=wheel), so both sides run the
# same kernels, and the peers start from the initial weights Parallax's stage-0 run
# writes, so every row trains the same model from the same parameters on the same data.
# Prints a table of median step time, max peak RSS per rank, model-state bytes per rank on
# the device (and, offloaded, on the host and NVMe) and bytes communicated per rank per
# step, each as a ratio to Parallax
# stage 0 measured in the same run, then how far each peer's per-step losses are from
# the Parallax row at the same ZeRO stage.
#
# Time and memory are measured in separate runs of each configuration: the timed run uses
# the normal allocator; the memory run (3 steps) sets MALLOC_MMAP_THRESHOLD_=65536, so that
# glibc returns large frees to the system and peak RSS shows what was live at once rather
# than the allocator's high-water mark (that setting makes every step several times
# slower, so it never applies to a timed run).
#
#   bench/zero.sh [--set key.path=value]...      e.g. --set model.d_model=256
#
# Environment: TORCH (wheel; debian measures Parallax on LibTorch 1.13 against the same
# PyTorch 2.11 peers), BUILD_DIR (TORCH's; configured and bench_zero_step built only when
# the directory does not exist), RANKS (4), STEPS (12; the first 2 are warm-up), CONFIG
# (configs/gpt_base.toml), RUN_TIMEOUT_S (600 per mpirun).
# A stage the build refuses is reported as "not available".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export TORCH="${TORCH:-wheel}"
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_dependencies
ensure_torch_wheel  # the peers' PyTorch 2.11, whichever LibTorch Parallax uses

RANKS="${RANKS:-4}"
STEPS="${STEPS:-12}"
CONFIG="${CONFIG:-configs/gpt_base.toml}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-600}"
ARGS=(--config "$CONFIG" --set logging.every=0 "$@")

BENCH="$(bench_binary bench_zero_step)"
PYTHON_TORCH="$PARALLAX_TORCH_VENV/bin/python"

LOGS="$(mktemp -d "${TMPDIR:-/tmp}/bench_zero.XXXXXX")"
RESULTS="$LOGS/results"
MEMORY="$LOGS/memory"
: >"$RESULTS"
: >"$MEMORY"
WEIGHTS="$LOGS/initial_weights.pt"

bench_measure "parallax-zero0" "$BENCH" "${ARGS[@]}" --set zero.stage=0 --write-initial-weights "$WEIGHTS"
for stage in 1 2 3; do
  bench_measure "parallax-zero$stage" "$BENCH" "${ARGS[@]}" --set "zero.stage=$stage"
done
bench_measure "zero2-off-cpu" "$BENCH" "${ARGS[@]}" --set zero.stage=2 --set 'offload.optimizer="cpu"'
bench_measure "zero3-off-cpu+p" "$BENCH" "${ARGS[@]}" --set zero.stage=3 --set 'offload.optimizer="cpu"' \
  --set 'offload.param="cpu"'
mkdir -p "$LOGS/nvme"
bench_measure "zero3-off-nvme+p" "$BENCH" "${ARGS[@]}" --set zero.stage=3 --set 'offload.optimizer="nvme"' \
  --set 'offload.param="nvme"' --set "offload.nvme_path=\"$LOGS/nvme\""
for mode in ddp zero1 fsdp2; do
  bench_measure "torch-$mode" "$PYTHON_TORCH" bench/peers/torch_zero.py --mode "$mode" --initial-weights "$WEIGHTS" \
    "${ARGS[@]}"
done

echo
echo "GPT example, $RANKS ranks, $CONFIG, $STEPS steps (median after 2 warm-up steps; per step the slowest rank;"
echo "Parallax built with TORCH=$TORCH ($BUILD_DIR), peers on PyTorch $("$PYTHON_TORCH" -c 'import torch; print(torch.__version__)'))"
# Fields of the JSON lines are read with awk so the table needs nothing beyond POSIX tools.
awk "$BENCH_AWK_FUNCTIONS"'
  function ratio(x, base) { return base > 0 ? sprintf("%.2f", x / base) : "n/a" }
  FILENAME == ARGV[1] {  # the memory runs: peak RSS by name
    rest = $0; sub(/^[^ ]+ /, "", rest)
    if (rest ~ /^\{/) memory[$1] = list_max(rest, "peak_rss_mib")
    next
  }
  {
    name[NR] = $1; rest = $0; sub(/^[^ ]+ /, "", rest); text[NR] = rest; row[$1] = NR
    if (rest ~ /^\{/) {
      ms[NR] = field(rest, "median_step_ms"); rss[NR] = ($1 in memory) ? memory[$1] : ""
      state[NR] = list_max(rest, "model_state_bytes"); loss[NR] = field(rest, "final_loss")
      host[NR] = list_max(rest, "host_bytes"); nvme[NR] = list_max(rest, "nvme_bytes")
      comm[NR] = list_max(rest, "comm_bytes_per_step")
      if ($1 == "parallax-zero0") {
        base_ms = ms[NR]; base_rss = rss[NR]; base_state = state[NR]; base_comm = comm[NR]; set_reference_losses(rest)
      }
    }
  }
  END {
    printf "%-16s %10s %7s %12s %7s %18s %7s %12s %12s %14s %7s %10s %10s\n", "impl/stage", "step ms", "ratio",
           "max RSS MiB", "ratio", "device state/rank", "ratio", "host/rank", "nvme/rank", "comm B/step", "ratio",
           "final loss", "loss diff"
    for (i = 1; i <= NR; ++i) {
      if (!(i in name)) continue
      if (text[i] !~ /^\{/) { printf "%-16s %s\n", name[i], text[i]; continue }
      printf "%-16s %10.1f %7s %12s %7s %18.0f %7s %12s %12s %14s %7s %10s %10s\n", name[i], ms[i],
             ratio(ms[i], base_ms), rss[i] == "" ? "n/a" : sprintf("%.1f", rss[i]),
             rss[i] == "" ? "n/a" : ratio(rss[i], base_rss), state[i], ratio(state[i], base_state),
             host[i] == "" ? "-" : sprintf("%.0f", host[i]), nvme[i] == "" ? "-" : sprintf("%.0f", nvme[i]),
             comm[i] == "" ? "-" : sprintf("%.0f", comm[i]), comm[i] == "" ? "-" : ratio(comm[i], base_comm),
             loss[i] == "null" ? "n/a" : sprintf("%.4f", loss[i]), loss_gap(text[i])
    }
    # The same cell on both sides: Parallax over its PyTorch peer.
    printf "\n%-32s %10s %12s %18s %12s\n", "Parallax / PyTorch, same cell", "step ms", "max RSS MiB",
           "device state/rank", "comm B/step"
    split("parallax-zero0 torch-ddp parallax-zero1 torch-zero1 parallax-zero3 torch-fsdp2", pair, " ")
    for (k = 1; k <= 6; k += 2) {
      a = row[pair[k]]; b = row[pair[k + 1]]
      if (!a || !b || text[a] !~ /^\{/ || text[b] !~ /^\{/) continue
      printf "%-32s %10s %12s %18s %12s\n", pair[k] " / " pair[k + 1], ratio(ms[a], ms[b]),
             (rss[a] == "" || rss[b] == "") ? "n/a" : ratio(rss[a], rss[b]), ratio(state[a], state[b]),
             (comm[a] == "" || comm[b] == "") ? "n/a" : ratio(comm[a], comm[b])
    }
  }
' "$MEMORY" "$RESULTS"
echo "(bytes/rank and RSS: the largest rank; ratios to parallax-zero0; RSS from a separate 3-step run with"
echo " MALLOC_MMAP_THRESHOLD_=65536, step times from runs with the normal allocator; loss diff: the largest"
echo " relative difference of any step's loss from parallax-zero0's, every row starting from its initial weights;"
echo " on CPU the \"device\" and the host are the same memory, so offloading moves bytes between columns, not"
echo " out of RSS; comm B/step: one rank's training collectives per step, each counted by its buffer (an"
echo " all-reduce's tensor, an all-gather's or reduce-scatter's full buffer), Parallax's from its counters, the"
echo " peers' from torch.profiler in one extra step; FSDP2 over gloo reduces gradients with all-reduces, which"
echo " move about twice a reduce-scatter's bytes on the wire for the same buffer; logs in $LOGS)"
