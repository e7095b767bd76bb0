#!/usr/bin/env bash
# bench/plan_accuracy.sh: how well parallel.mode = "auto" predicts, and what its choice
# costs against the best layout found by running them all.
#
# 1. Prediction: the GPT example (configs/auto.toml, d_model 256, vocabulary 1024,
#    sequence 64) trains
#    RUN_STEPS steps under each layout of a list (4 and 8 ranks, one node and two
#    emulated ones), every layout key fixed, so the planner scores exactly that layout
#    with this machine's measured figures. Predicted step time (the metrics'
#    predicted_step_ms) against the measured median of the steps after the first two,
#    and predicted memory per rank (the largest stage's) against rank 0's peak resident
#    memory since planning less its resident memory before; the median absolute
#    percentage error of each over all of them. The step time twice: the model's own
#    prediction, and the one a run reports, which is the model's times the median
#    measured / predicted ratio of the earlier runs with the same layer-time file (the
#    same machine and rank count; the bench starts from an empty auto.profile_cache, so
#    the first run of each rank count has no correction). The ranks run on tcmalloc (LD_PRELOAD):
#    glibc's malloc keeps freed large buffers resident once its mmap threshold rises, so
#    its peak resident memory measures the allocator, not the tensors (docs/planner.md).
# 2. Regret: on three clusters (4 ranks on one node, 4 ranks on two emulated nodes, 8
#    ranks on two emulated nodes) and two model sizes (2 and 6 layers), every layout of
#    tp x pp x ZeRO (0, 1) at the micro-batch auto chooses is run, and auto's own choice;
#    regret = auto's measured step time / the best measured - 1.
#
# 3. Allocator: predicted memory against the measured peak for ZeRO 0 and 1 on glibc's
#    malloc and on tcmalloc, with the step time of each. A build that links tcmalloc
#    (PARALLAX_MALLOC, the default where it is installed) cannot run on glibc's: that
#    half needs a build configured with -DPARALLAX_MALLOC=system (BUILD_DIR).
#
#   bench/plan_accuracy.sh            # all three parts (about 16 minutes on 2 cores)
#   PART=prediction bench/plan_accuracy.sh   # or regret, or allocator
#
# Environment: TORCH (debian), BUILD_DIR (TORCH's), RUN_STEPS (8), RUN_TIMEOUT_S (300).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source bench/common.sh
export OMP_NUM_THREADS=1
ensure_dependencies

RUN_STEPS="${RUN_STEPS:-8}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-300}"
PART="${PART:-all}"
TRAIN="$(train_gpt_binary)"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/bench_plan_accuracy.XXXXXX")"
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -f "$TCMALLOC" ] || { echo "error: $TCMALLOC is missing (scripts/common.sh installs libtcmalloc-minimal4)" >&2; exit 1; }
MODEL=(--set model.d_model=256 --set model.vocab_size=1024 --set model.block_size=64)

# run NAME RANKS ARGS...: one auto run; prints "predicted-ms measured-ms chosen-layout
# predicted-MB measured-MB model-ms" or fails. PRELOAD: the malloc (default tcmalloc).
run() {
  local name="$1" ranks="$2"
  shift 2
  echo "running $name ..." >&2
  timeout "$RUN_TIMEOUT_S" mpirun -np "$ranks" --oversubscribe --bind-to none -x LD_PRELOAD="${PRELOAD-$TCMALLOC}" \
    "$TRAIN" --config configs/auto.toml \
    "${MODEL[@]}" --set train.steps="$RUN_STEPS" --set logging.every=0 --set "auto.profile_cache=\"$LOGS/profiles\"" \
    --set "logging.metrics_file=\"$LOGS/$name.jsonl\"" "$@" >"$LOGS/$name.log" 2>&1 ||
    { echo "error: $name failed (log: $LOGS/$name.log)" >&2; return 1; }
  python3 - "$LOGS/$name.jsonl" "$LOGS/$name.log" <<'PY'
import json, re, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
measured = statistics.median(r["step_ms"] for r in rows[2:])
log = open(sys.argv[2]).read().splitlines()
chosen = next(re.sub(r",schedule=1f1b,vp=1,recompute=none", "", l.split("chosen: ")[1].strip())
              for l in log if l.startswith("  chosen: "))
memory = next(re.search(r"predicted ([0-9.]+) MB per rank, measured ([0-9.]+) MB", l).groups()
              for l in log if "MB per rank" in l)
model_ms = 1000 * float(next(re.search(r"step time: ([0-9.]+) s", l).group(1) for l in log if "  step time: " in l))
print(f"{rows[-1]['predicted_step_ms']:.2f} {measured:.2f} {chosen} {memory[0]} {memory[1]} {model_ms:.0f}")
PY
}

# The layout keys of "tp=2,pp=1,dp=2,zero=1,mbs=8" as --set arguments.
fixed() {
  local IFS=, item
  for item in $1; do
    case "$item" in
      tp=*) echo "--set parallel.tp=${item#tp=}" ;;
      pp=*) echo "--set parallel.pp=${item#pp=}" ;;
      dp=*) echo "--set parallel.dp=${item#dp=}" ;;
      zero=*) echo "--set zero.stage=${item#zero=}" ;;
      mbs=*) echo "--set train.micro_batch_size=${item#mbs=}" ;;
      nodes=*) echo "--set topology.emulate_nodes=${item#nodes=}" ;;
    esac
  done
}

if [[ "$PART" == all || "$PART" == prediction ]]; then
  printf '%-44s %8s %7s %12s %12s %7s %12s %12s %7s\n' "layout (4 layers)" "model ms" "error" "predicted ms" \
    "measured ms" "error" "predicted MB" "measured MB" "error"
  errors=() model_errors=() memory_errors=()
  for case in \
    "4:tp=1,pp=1,dp=4,zero=0,mbs=8" "4:tp=1,pp=1,dp=4,zero=0,mbs=2" "4:tp=1,pp=1,dp=4,zero=1,mbs=8" \
    "4:tp=1,pp=1,dp=4,zero=2,mbs=4" "4:tp=1,pp=1,dp=4,zero=3,mbs=8" "4:tp=2,pp=1,dp=2,zero=0,mbs=16" \
    "4:tp=2,pp=1,dp=2,zero=1,mbs=4" "4:tp=4,pp=1,dp=1,zero=0,mbs=8" "4:tp=1,pp=2,dp=2,zero=0,mbs=4" \
    "4:tp=1,pp=2,dp=2,zero=1,mbs=2" "4:tp=1,pp=4,dp=1,zero=0,mbs=4" "4:tp=2,pp=2,dp=1,zero=0,mbs=8" \
    "4:tp=1,pp=1,dp=4,zero=1,mbs=8,nodes=2" "4:tp=2,pp=1,dp=2,zero=0,mbs=8,nodes=2" \
    "4:tp=1,pp=2,dp=2,zero=0,mbs=4,nodes=2" "8:tp=1,pp=1,dp=8,zero=0,mbs=4" "8:tp=1,pp=1,dp=8,zero=1,mbs=4" \
    "8:tp=2,pp=1,dp=4,zero=0,mbs=8" "8:tp=2,pp=2,dp=2,zero=1,mbs=4" "8:tp=1,pp=2,dp=4,zero=0,mbs=4,nodes=2" \
    "8:tp=2,pp=1,dp=4,zero=1,mbs=4,nodes=2" "8:tp=4,pp=2,dp=1,zero=0,mbs=8,nodes=2"; do
    ranks="${case%%:*}" layout="${case#*:}"
    read -r predicted measured _ predicted_mb measured_mb model_ms < <(run "p-$ranks-${layout//[,=]/_}" "$ranks" \
      --set model.n_layer=4 $(fixed "$layout"))
    error=$(awk -v p="$predicted" -v m="$measured" 'BEGIN{printf "%+.0f%%", 100 * (p - m) / m}')
    model_error=$(awk -v p="$model_ms" -v m="$measured" 'BEGIN{printf "%+.0f%%", 100 * (p - m) / m}')
    memory_error=$(awk -v p="$predicted_mb" -v m="$measured_mb" 'BEGIN{printf "%+.0f%%", 100 * (p - m) / m}')
    errors+=("$error") model_errors+=("$model_error") memory_errors+=("$memory_error")
    printf '%-44s %8s %7s %12s %12s %7s %12s %12s %7s\n' "np$ranks $layout" "$model_ms" "$model_error" "$predicted" \
      "$measured" "$error" "$predicted_mb" "$measured_mb" "$memory_error"
  done
  median() {
    awk '{gsub(/[%+-]/, ""); print}' | sort -n |
      awk -v what="$1" '{a[NR] = $1} END {m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
           printf "median absolute percentage error of %s over %d layouts: %.0f%%\n", what, NR, m}'
  }
  printf '%s\n' "${model_errors[@]}" | median "the step time, the model's own"
  printf '%s\n' "${errors[@]}" | median "the step time, corrected by the earlier runs' ratios"
  printf '%s\n' "${memory_errors[@]}" | median "the memory per rank (rank 0: peak resident growth from the plan)"
fi

if [[ "$PART" == all || "$PART" == regret ]]; then
  printf '\n%-26s %-30s %12s %-30s %12s %8s\n' "cluster, model" "auto's choice" "measured ms" "best run" \
    "measured ms" "regret"
  for cluster in "4:1" "4:2" "8:2"; do
    ranks="${cluster%%:*}" nodes="${cluster#*:}"
    for layers in 2 6; do
      name="r-$ranks-$nodes-$layers"
      read -r _ auto_ms auto_layout < <(run "$name-auto" "$ranks" --set model.n_layer="$layers" \
        --set topology.emulate_nodes="$nodes")
      mbs=$(sed -n 's/.*mbs=\([0-9]*\).*/\1/p' <<<"$auto_layout")
      best_ms="" best=""
      for tp in 1 2 4; do
        for pp in 1 2 4; do
          (( tp * pp <= ranks )) || continue
          (( tp <= ranks / nodes )) || continue
          for zero in 0 1; do
            layout="tp=$tp,pp=$pp,zero=$zero,mbs=$mbs"
            read -r _ ms _ < <(run "$name-${layout//[,=]/_}" "$ranks" --set model.n_layer="$layers" \
              --set topology.emulate_nodes="$nodes" $(fixed "$layout")) || continue
            if [[ -z "$best_ms" ]] || awk -v a="$ms" -v b="$best_ms" 'BEGIN{exit !(a < b)}'; then
              best_ms="$ms" best="$layout"
            fi
          done
        done
      done
      regret=$(awk -v a="$auto_ms" -v b="$best_ms" 'BEGIN{r = a / b - 1; if (r < 0) r = 0; printf "%.0f%%", 100 * r}')
      printf '%-26s %-30s %12s %-30s %12s %8s\n' "np$ranks, $nodes node(s), $layers layers" \
        "$(cut -d, -f1-4 <<<"$auto_layout"),mbs=$mbs" "$auto_ms" "$best" "$best_ms" "$regret"
    done
  done
fi

if [[ "$PART" == all || "$PART" == allocator ]]; then
  printf '\n%-36s %12s %12s %7s %12s\n' "malloc, layout (4 layers, 4 ranks)" "predicted MB" "measured MB" "error" \
    "measured ms"
  for malloc in glibc tcmalloc; do
    if [[ "$malloc" == glibc ]] && readelf -d "$TRAIN" | grep -q 'libtcmalloc'; then
      printf '%-36s %s\n' "glibc" "not measured: $TRAIN links tcmalloc (configure with -DPARALLAX_MALLOC=system)"
      continue
    fi
    for layout in "tp=1,pp=1,dp=4,zero=0,mbs=8" "tp=1,pp=1,dp=4,zero=1,mbs=8"; do
      preload=""
      [[ "$malloc" == tcmalloc ]] && preload="$TCMALLOC"
      read -r _ measured _ predicted_mb measured_mb _ < <(PRELOAD="$preload" run "a-$malloc-${layout//[,=]/_}" 4 \
        --set model.n_layer=4 $(fixed "$layout"))
      printf '%-36s %12s %12s %7s %12s\n' "$malloc $layout" "$predicted_mb" "$measured_mb" \
        "$(awk -v p="$predicted_mb" -v m="$measured_mb" 'BEGIN{printf "%+.0f%%", 100 * (p - m) / m}')" "$measured"
    done
  done
fi
