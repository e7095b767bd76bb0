#!/usr/bin/env bash
# bench/tp.sh: the GPT example on 4 ranks split by configs/tp.toml's plan at tp = 1, 2
# and 4 (dp = 4, 2, 1), with and without sequence parallelism, one mpirun each
# (bench_zero_step). Prints the median step time as a ratio to tp = 1 measured in the
# same run, and the tensor-parallel group's bytes per rank per step against Megatron's
# count for the same shapes:
#
#   per layer and micro-batch, forward + backward: 8·b·s·h·(t−1)/t elements
#   (4 ring all-reduces of b·s·h, each moving 2·(t−1)/t of it per rank; sequence
#   parallelism's all-gathers and reduce-scatters move (t−1)/t each, twice as many),
#
# where b is the micro-batch, s the sequence, h the hidden size, t = tp. The measured
# payload (communicator counters) is turned into the same ring bytes per rank. Beyond the
# layers the model moves the embedding's output forward and the LM head's input gradient
# backward (b·s·h each, one all-reduce or its sequence-parallel pair) and the
# vocab-parallel loss's 3 values per token; the "whole model" column adds those, so its
# ratio is exact. Beside them, the same model from the same initial weights split the same
# way by PyTorch 2.11's DTensor tensor parallelism (bench/peers/torch_tp.py) at tp = 2 and
# 4; Parallax builds with TORCH=wheel by default, so both run LibTorch 2.11's kernels. The
# last column is each row's largest per-step loss difference from tp = 1's. A second table
# puts each tp cell over its PyTorch peer: step time, peak RSS per rank (from a separate
# 3-step run of each row, bench_measure), and the bytes one rank communicates per step.
#
#   bench/tp.sh [--set key.path=value]...      e.g. --set model.d_model=512
#
# Environment: TORCH (wheel), BUILD_DIR (TORCH's; configured and bench_zero_step built
# only when the directory does not exist), RANKS (4), STEPS (8; the first 2 are warm-up),
# RUN_TIMEOUT_S (600 per mpirun).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export TORCH="${TORCH:-wheel}"
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_dependencies
ensure_torch_wheel  # the peer's PyTorch 2.11, whichever LibTorch Parallax uses

RANKS="${RANKS:-4}"
STEPS="${STEPS:-8}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-600}"
# A model big enough that the layers' traffic dominates: 4 layers of 256, 128 tokens.
ARGS=(--config configs/tp.toml --set logging.every=0 --set model.d_model=256
  --set model.n_layer=4 --set model.block_size=128 --set model.vocab_size=1024 --set train.global_batch_size=16 "$@")

BENCH="$(bench_binary bench_zero_step)"

LOGS="$(mktemp -d "${TMPDIR:-/tmp}/bench_tp.XXXXXX")"
RESULTS="$LOGS/results"
MEMORY="$LOGS/memory"
: >"$RESULTS"
: >"$MEMORY"
WEIGHTS="$LOGS/initial_weights.pt"
run() {
  local name="$1"
  shift
  bench_measure "$name" "$BENCH" "${ARGS[@]}" "$@"
}

run tp1 --set parallel.tp=1 --write-initial-weights "$WEIGHTS"
for tp in 2 4; do
  run "tp$tp" --set "parallel.tp=$tp"
  run "tp$tp-sp" --set "parallel.tp=$tp" --set tensor_parallel.sequence_parallel=true
done
for tp in 2 4; do
  bench_measure "torch-tp$tp" "$PARALLAX_TORCH_VENV/bin/python" bench/peers/torch_tp.py "${ARGS[@]}" \
    --set "parallel.tp=$tp" --initial-weights "$WEIGHTS"
done

echo
echo "GPT example, $RANKS ranks, configs/tp.toml ${*:-} ($STEPS steps, median after 2 warm-up; per step the slowest rank)"
awk -v ranks="$RANKS" -v global_batch="$(grep -o 'global_batch_size=[0-9]*' <<<"${ARGS[*]}" | tail -1 | cut -d= -f2)" \
  -v seq="$(grep -o 'block_size=[0-9]*' <<<"${ARGS[*]}" | tail -1 | cut -d= -f2)" \
  -v hidden="$(grep -o 'd_model=[0-9]*' <<<"${ARGS[*]}" | tail -1 | cut -d= -f2)" \
  -v layers="$(grep -o 'n_layer=[0-9]*' <<<"${ARGS[*]}" | tail -1 | cut -d= -f2)" "$BENCH_AWK_FUNCTIONS"'
  function ratio(x, base) { return (x != "" && base > 0) ? sprintf("%.2f", x / base) : "n/a" }
  FILENAME == ARGV[1] {  # the memory runs: peak RSS by name
    rest = $0; sub(/^[^ ]+ /, "", rest)
    if (rest ~ /^\{/) memory[$1] = list_max(rest, "peak_rss_mib")
    next
  }
  {
    name[NR] = $1; rest = $0; sub(/^[^ ]+ /, "", rest); text[NR] = rest; row[$1] = NR
    if (rest !~ /^\{/) next
    ms[NR] = field(rest, "median_step_ms"); t[NR] = field(rest, "tp"); loss[NR] = field(rest, "final_loss")
    rss[NR] = ($1 in memory) ? memory[$1] : ""; comm[NR] = list_max(rest, "comm_bytes_per_step")
    ar = field(rest, "all_reduce"); ag = field(rest, "all_gather"); rs = field(rest, "reduce_scatter")
    tt = t[NR]
    wire[NR] = tt > 1 ? (2 * ar + ag + rs) * (tt - 1) / tt : 0
    b = global_batch / (ranks / tt)   # micro-batch: grad_accum 1, dp = ranks / tp
    per_layer = 8 * b * seq * hidden * (tt - 1) / tt * 4
    layers_formula[NR] = layers * per_layer
    # embedding forward + head backward (b·s·h each) and the loss (3 values per token)
    whole_formula[NR] = layers_formula[NR] + (2 * b * seq * hidden + 3 * b * seq) * 2 * (tt - 1) / tt * 4
    peer[NR] = field(rest, "impl") != "parallax"
    if ($1 == "tp1") { base_ms = ms[NR]; base_rss = rss[NR]; set_reference_losses(rest) }
  }
  END {
    printf "%-9s %9s %6s %8s %6s %13s %15s %7s %13s %7s %10s %9s\n", "layout", "step ms", "ratio", "RSS MiB",
           "ratio", "TP bytes/rank", "Megatron layers", "ratio", "whole model", "ratio", "final loss", "loss diff"
    for (i = 1; i <= NR; ++i) {
      if (!(i in name)) continue
      if (text[i] !~ /^\{/) { printf "%-9s %s\n", name[i], text[i]; continue }
      measured = !peer[i]
      printf "%-9s %9.1f %6s %8s %6s %13s %15.0f %7s %13.0f %7s %10s %9s\n", name[i], ms[i], ratio(ms[i], base_ms),
             (rss[i] == "" ? "n/a" : sprintf("%.1f", rss[i])), ratio(rss[i], base_rss),
             (measured ? sprintf("%.0f", wire[i]) : "-"), layers_formula[i],
             ((measured && layers_formula[i] > 0) ? sprintf("%.3f", wire[i] / layers_formula[i]) : "-"),
             whole_formula[i], ((measured && whole_formula[i] > 0) ? sprintf("%.3f", wire[i] / whole_formula[i]) : "-"),
             loss[i], loss_gap(text[i])
    }
    # The same cell on both sides: Parallax over its PyTorch peer.
    printf "\n%-26s %8s %8s %14s %14s %7s\n", "Parallax / PyTorch", "step ms", "RSS MiB", "parallax B/step",
           "torch B/step", "ratio"
    for (tt = 2; tt <= 4; tt *= 2) {
      a = row["tp" tt]; p = row["torch-tp" tt]
      if (!a || !p || text[a] !~ /^\{/ || text[p] !~ /^\{/) continue
      printf "%-26s %8s %8s %14.0f %14.0f %7s\n", "tp" tt " / torch-tp" tt, ratio(ms[a], ms[p]),
             ratio(rss[a], rss[p]), comm[a], comm[p], ratio(comm[a], comm[p])
    }
  }
' "$MEMORY" "$RESULTS"
echo "(TP bytes: ring bytes per rank per step, from the payload the tensor-parallel communicator counted; the"
echo " grad-norm all-reduce adds 8 bytes; with sequence parallelism the replicated parameters' partial gradients"
echo " (LayerNorms, row biases, position embedding) are summed over the group once per step, which the whole-model"
echo " count leaves out; b = global batch / dp; torch-tpN: DTensor, whose traffic is counted only as a whole;"
echo " RSS: the largest rank's peak, from a separate 3-step run with MALLOC_MMAP_THRESHOLD_=65536 (step times"
echo " from runs with the normal allocator); B/step: one rank's collectives per step over every group, each counted"
echo " by its buffer, Parallax's from its counters, PyTorch's from torch.profiler in one extra step; loss diff: the"
echo " largest relative difference of any step's loss from tp1's, every row from the same initial weights;"
echo " logs in $LOGS)"
