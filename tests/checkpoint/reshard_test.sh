#!/usr/bin/env bash
# Checkpoints load under another layout with no conversion step: the GPT example
# (configs/gpt_base.toml, 10 steps) saves at step 5 under one layout (checkpoint.every =
# 5), separate mpirun jobs of other world sizes and strategies load that checkpoint and
# train steps 6–10, and each continued step's loss must match the saving run's own step
# within TOLERANCE (relative; the reduction order differs across layouts, so not bit for
# bit). Prints the worst difference per pair as "[ figures  ]".
#
#   reshard_test.sh MPIEXEC TRAIN_GPT CONFIG_DIR
#
# Measured (2 cores, OpenBLAS): at most 1.6e-7 over the pairs below (dp 4 ZeRO-3 -> tp
# 2, whose split matrix products sum in another order); the bound is about 10x that,
# tighter than the issue's 1e-5. A load that leaves state behind (the moments, the
# optimizer's step count, a rank's part) moves the losses after it far more (see
# resume_test.cpp's mutants); a tp rank that takes the first elements of a whole tensor
# instead of its cut part misses by 1e-1 at step 6, and a join of tp 2's parts that
# ignores the fused [q | k | v] blocks by 5e-3 (1.6e-2 by step 10).
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
CONFIGS="$3"
TOLERANCE=1.5e-6
WORK="$(mktemp -d "${TMPDIR:-/tmp}/reshard_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# run NAME RANKS ARGS...: train_gpt on RANKS ranks, its metrics in $WORK/NAME.jsonl.
run() {
  local name="$1" ranks="$2"
  shift 2
  if ! timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -np "$ranks" "$TRAIN" \
    --config "$CONFIGS/${CONFIG:-gpt_base.toml}" --set train.steps=10 --set logging.every=0 \
    --set "logging.metrics_file=\"$WORK/$name.jsonl\"" "$@" >"$WORK/$name.log" 2>&1; then
    echo "FAIL: $name (log below)"
    cat "$WORK/$name.log"
    exit 1
  fi
}

# compare SOURCE TARGET: TARGET's steps 6–10 against SOURCE's.
failed=0
compare() {
  awk -v tolerance="$TOLERANCE" -v pair="$1 -> $2" '
    function loss_of(line,    m) { match(line, /"loss":[^,]+/); m = substr(line, RSTART + 7, RLENGTH - 7); return m + 0 }
    function step_of(line,    m) { match(line, /"step":[0-9]+/); return substr(line, RSTART + 7, RLENGTH - 7) + 0 }
    FNR == NR { want[step_of($0)] = loss_of($0); next }
    {
      step = step_of($0); got = loss_of($0); seen++
      d = got - want[step]; if (d < 0) d = -d; d /= want[step]
      if (d > worst) worst = d
      if (d > tolerance) { printf "FAIL: %s step %d: loss %.9g, the saving run had %.9g\n", pair, step, got, want[step]; bad = 1 }
    }
    END {
      if (seen != 5) { printf "FAIL: %s trained %d steps after the resume, expected 5\n", pair, seen; exit 1 }
      printf "[ figures  ] reshard %-36s steps 6-10, worst relative loss difference %.1e\n", pair, worst
      exit bad
    }' "$WORK/$1.jsonl" "$WORK/$2.jsonl" || failed=1
}

# The saving runs.
run zero3-dp4 4 --set zero.stage=3 --set "checkpoint.dir=\"$WORK/zero3-dp4\"" --set checkpoint.every=5
CONFIG=tp.toml run tp2-dp2 4 --set zero.stage=1 --set "checkpoint.dir=\"$WORK/tp2-dp2\"" --set checkpoint.every=5
run pp2-1f1b 2 --set parallel.pp=2 --set 'pipeline.schedule="1f1b"' --set "checkpoint.dir=\"$WORK/pp2-1f1b\"" \
  --set checkpoint.every=5
run cp2-dp2 4 --set parallel.cp=2 --set zero.stage=1 --set "checkpoint.dir=\"$WORK/cp2-dp2\"" --set checkpoint.every=5
CONFIG=moe.toml run ep4-dp4 4 --set parallel.ep=4 --set "checkpoint.dir=\"$WORK/ep4-dp4\"" --set checkpoint.every=5
step5() { echo "checkpoint.load=\"$WORK/$1/step-000000000005\""; }

# dp 4 ZeRO-3 -> dp 2 replicated, -> pp 2, -> one process.
run zero3-to-dp2 2 --set zero.stage=0 --set "$(step5 zero3-dp4)"
compare zero3-dp4 zero3-to-dp2
run zero3-to-pp2 2 --set parallel.pp=2 --set "$(step5 zero3-dp4)"
compare zero3-dp4 zero3-to-pp2
run zero3-to-single 1 --set zero.stage=0 --set "$(step5 zero3-dp4)"
compare zero3-dp4 zero3-to-single
# dp 4 ZeRO-3 -> dp 2 ZeRO-2 with the optimizer offloaded to the host (offload on).
run zero3-to-offload 2 --set zero.stage=2 --set 'offload.optimizer="cpu"' --set "$(step5 zero3-dp4)"
compare zero3-dp4 zero3-to-offload
# dp 4 ZeRO-3 -> tp 2 (configs/tp.toml's plan; each rank cuts its part from the whole
# tensors), -> tp 2 x dp 2 with sequence parallelism and ZeRO-1.
CONFIG=tp.toml run zero3-to-tp2 2 --set zero.stage=0 --set "$(step5 zero3-dp4)"
compare zero3-dp4 zero3-to-tp2
CONFIG=tp.toml run zero3-to-tp2dp2sp 4 --set zero.stage=1 --set tensor_parallel.sequence_parallel=true \
  --set "$(step5 zero3-dp4)"
compare zero3-dp4 zero3-to-tp2dp2sp
# pp 2 -> dp 4 ZeRO-1, -> pp 2 x dp 2 interleaved ZeRO-2.
run pp2-to-zero1 4 --set zero.stage=1 --set "$(step5 pp2-1f1b)"
compare pp2-1f1b pp2-to-zero1
run pp2-to-pp2dp2 4 --set parallel.pp=2 --set 'pipeline.schedule="interleaved"' --set pipeline.virtual_stages=2 \
  --set zero.stage=2 --set "$(step5 pp2-1f1b)"
compare pp2-1f1b pp2-to-pp2dp2
# tp 2 x dp 2 ZeRO-1 (each part saved with its cut) -> one process (the parts joined),
# -> tp 4 (joined, then cut in four), -> tp 2 x pp 2 (the same tp: each rank reads its part).
run tp2-to-single 1 --set zero.stage=0 --set "$(step5 tp2-dp2)"
compare tp2-dp2 tp2-to-single
CONFIG=tp.toml run tp2-to-tp4 4 --set parallel.tp=4 --set zero.stage=0 --set "$(step5 tp2-dp2)"
compare tp2-dp2 tp2-to-tp4
CONFIG=tp.toml run tp2-to-tp2pp2 4 --set parallel.pp=2 --set zero.stage=0 --set "$(step5 tp2-dp2)"
compare tp2-dp2 tp2-to-tp2pp2
# cp 2 x dp 2 ZeRO-1 (each sequence over 2 ranks) -> one process, -> cp 4 all-to-all;
# dp 4 ZeRO-3 -> cp 2 x dp 2 ZeRO-2.
run cp2-to-single 1 --set zero.stage=0 --set "$(step5 cp2-dp2)"
compare cp2-dp2 cp2-to-single
run cp2-to-cp4 4 --set parallel.cp=4 --set 'context_parallel.method="all_to_all"' --set "$(step5 cp2-dp2)"
compare cp2-dp2 cp2-to-cp4
run zero3-to-cp2 4 --set parallel.cp=2 --set zero.stage=2 --set "$(step5 zero3-dp4)"
compare zero3-dp4 zero3-to-cp2
# Mixture of experts, saved at ep 4 ZeRO-1 (each expert once, under its global index) ->
# ep 2 ZeRO-2 (each rank reads its block of experts), -> one process (every expert).
CONFIG=moe.toml run ep4-to-ep2 4 --set parallel.ep=2 --set zero.stage=2 --set "$(step5 ep4-dp4)"
compare ep4-dp4 ep4-to-ep2
CONFIG=moe.toml run ep4-to-single 1 --set parallel.ep=1 --set zero.stage=0 --set "$(step5 ep4-dp4)"
compare ep4-dp4 ep4-to-single
exit "$failed"
