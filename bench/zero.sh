#!/usr/bin/env bash
# bench/zero.sh: the GPT example on 4 ranks under ZeRO stages 0–3 (bench_zero_step), under
# ZeRO-Offload (stage 2 with the optimizer on the CPU; stage 3 with optimizer and
# parameters on the CPU, and on the NVMe tier under $TMPDIR) and, with the same model,
# batch and config, under PyTorch DDP and DDP + ZeroRedundancyOptimizer over gloo
# (bench/peers/torch_zero.py). Each configuration is its own mpirun, so its peak RSS is
# its own. Prints a table of median step time, max peak RSS per rank and model-state
# bytes per rank on the device (and, offloaded, on the host and NVMe), each as a ratio to
# Parallax stage 0 measured in the same run.
#
#   bench/zero.sh [--set key.path=value]...      e.g. --set model.d_model=256
#
# Environment: BUILD_DIR (default build; configured and bench_zero_step built only when
# the directory does not exist), RANKS (4), STEPS (12; the first 2 are warm-up), CONFIG
# (configs/gpt_base.toml), PYTHON (a python3 that imports torch; default: the first of
# /usr/bin/python3 and python3 that does), RUN_TIMEOUT_S (600 per mpirun).
# A stage the build refuses is reported as "not available"; without PyTorch the
# Parallax rows are still printed, with the line that installs it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
# glibc keeps freed blocks above its (growing) mmap threshold in the heap, so peak RSS
# would show the allocator's high-water mark rather than what was live at once; a fixed
# 64 KiB threshold returns large frees to the system. Applies to every row alike.
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-65536}"
# The PyTorch peers need Debian's python3-torch; only this bench does, so only it installs it.
PARALLAX_DEB_PACKAGES+=(python3-torch)
ensure_dependencies

BUILD_DIR="${BUILD_DIR:-build}"
RANKS="${RANKS:-4}"
STEPS="${STEPS:-12}"
CONFIG="${CONFIG:-configs/gpt_base.toml}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-600}"
ARGS=(--config "$CONFIG" --set "train.steps=$STEPS" --set logging.every=0 "$@")

BENCH="$(bench_binary bench_zero_step)"

PYTHON_TORCH="$(python_with_torch)"

LOGS="$(mktemp -d "${TMPDIR:-/tmp}/bench_zero.XXXXXX")"
RESULTS="$LOGS/results"
: >"$RESULTS"

for stage in 0 1 2 3; do
  bench_run "parallax-zero$stage" "$BENCH" "${ARGS[@]}" --set "zero.stage=$stage"
done
bench_run "zero2-off-cpu" "$BENCH" "${ARGS[@]}" --set zero.stage=2 --set 'offload.optimizer="cpu"'
bench_run "zero3-off-cpu+p" "$BENCH" "${ARGS[@]}" --set zero.stage=3 --set 'offload.optimizer="cpu"' \
  --set 'offload.param="cpu"'
mkdir -p "$LOGS/nvme"
bench_run "zero3-off-nvme+p" "$BENCH" "${ARGS[@]}" --set zero.stage=3 --set 'offload.optimizer="nvme"' \
  --set 'offload.param="nvme"' --set "offload.nvme_path=\"$LOGS/nvme\""
if [[ -n "$PYTHON_TORCH" ]]; then
  for mode in ddp zero1; do
    bench_run "torch-$mode" "$PYTHON_TORCH" bench/peers/torch_zero.py --mode "$mode" --rendezvous "$LOGS/rendezvous.$mode" \
      "${ARGS[@]}"
  done
else
  echo "torch-ddp not run: PyTorch missing" >>"$RESULTS"
  echo "torch-zero1 not run: PyTorch missing" >>"$RESULTS"
fi

echo
echo "GPT example, $RANKS ranks, $CONFIG, $STEPS steps (median after 2 warm-up steps; per step the slowest rank)"
# Fields of the JSON lines are read with awk so the table needs nothing beyond POSIX tools.
awk '
  function field(line, key,    m) {
    if (!match(line, "\"" key "\": [^,}]+")) return ""
    m = substr(line, RSTART, RLENGTH); sub(/^[^:]*: /, "", m); gsub(/"/, "", m); return m
  }
  function list_max(line, key,    m, n, i, v, best) {
    if (!match(line, "\"" key "\": \\[[^]]*\\]")) return ""
    m = substr(line, RSTART, RLENGTH); sub(/^[^[]*\[/, "", m); sub(/\]$/, "", m)
    n = split(m, v, /, */); best = v[1] + 0
    for (i = 2; i <= n; ++i) if (v[i] + 0 > best) best = v[i] + 0
    return best
  }
  function ratio(x, base) { return base > 0 ? sprintf("%.2f", x / base) : "n/a" }
  {
    name[NR] = $1; rest = $0; sub(/^[^ ]+ /, "", rest); text[NR] = rest
    if (rest ~ /^\{/) {
      ms[NR] = field(rest, "median_step_ms"); rss[NR] = list_max(rest, "peak_rss_mib")
      state[NR] = list_max(rest, "model_state_bytes"); loss[NR] = field(rest, "final_loss")
      host[NR] = list_max(rest, "host_bytes"); nvme[NR] = list_max(rest, "nvme_bytes")
      if ($1 == "parallax-zero0") { base_ms = ms[NR]; base_rss = rss[NR]; base_state = state[NR] }
    }
  }
  END {
    printf "%-16s %10s %7s %12s %7s %18s %7s %12s %12s %10s\n", "impl/stage", "step ms", "ratio", "max RSS MiB",
           "ratio", "device state/rank", "ratio", "host/rank", "nvme/rank", "final loss"
    for (i = 1; i <= NR; ++i) {
      if (text[i] !~ /^\{/) { printf "%-16s %s\n", name[i], text[i]; continue }
      printf "%-16s %10.1f %7s %12.1f %7s %18.0f %7s %12s %12s %10s\n", name[i], ms[i], ratio(ms[i], base_ms), rss[i],
             ratio(rss[i], base_rss), state[i], ratio(state[i], base_state),
             host[i] == "" ? "-" : sprintf("%.0f", host[i]), nvme[i] == "" ? "-" : sprintf("%.0f", nvme[i]),
             loss[i] == "null" ? "n/a" : sprintf("%.4f", loss[i])
    }
  }
' "$RESULTS"
echo "(bytes/rank and RSS: the largest rank; ratios to parallax-zero0; on CPU the \"device\" and the host are"
echo " the same memory, so offloading moves bytes between columns, not out of RSS; logs in $LOGS)"
if [[ -z "$PYTHON_TORCH" ]]; then
  echo
  echo "PyTorch peers skipped: no python3 here imports torch. On Debian 12 install it with:"
  echo "  sudo apt-get install -y python3-torch"
fi
