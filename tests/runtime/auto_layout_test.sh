#!/usr/bin/env bash
# parallel.mode = "auto" (configs/auto.toml) end to end, on real ranks:
#  1. 4 ranks: rank 0 prints the measured machine, the chosen layout with its predicted
#     memory and time, the runners-up; the run trains with it (the loss falls) and the
#     resolved configuration is the chosen one;
#  2. a key the config sets is kept (--set zero.stage=1, --set parallel.pp=2); in manual
#     mode a key set to "auto" is the only one the planner chooses;
#  3. a constraint no layout meets fails on every rank, naming it, and never hangs;
#  4. a checkpoint saved by an auto run on 4 ranks resumes in auto mode on 2 ranks (the
#     planner picks a layout for the new world, the checkpoint reshards on load) and
#     steps 6-10 match the saving run's within reshard_test's bound (1.5e-6 relative).
# Mutants caught: a fixed key overwritten by the planner (2), ranks planning apart
# (rank 0's figures not shared: layouts differ and the run refuses mismatched configs
# or hangs), an unmet constraint planned anyway (3).
# Usage: auto_layout_test.sh <mpiexec> <train_gpt> <configs-dir>
set -u
mpiexec=$1 train=$2 configs=$3
launch=("$mpiexec" --oversubscribe --bind-to none)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

# run NAME RANKS ARGS...: train_gpt on configs/auto.toml, output in $work/NAME.log.
run() {
  local name=$1 ranks=$2; shift 2
  timeout 300 "${launch[@]}" -np "$ranks" "$train" --config "$configs/auto.toml" "$@" >"$work/$name.log" 2>&1
}

# 1. Plans, explains, trains.
if run auto 4 --set train.steps=20; then
  log=$work/auto.log
  for line in "# auto layout (parallel.mode = \"auto\" at " "  measured: 1 node(s) x 4 rank(s)" "  chosen: tp=" \
              "  step time: " "layouts run and fit"; do
    grep -qF -- "$line" "$log" || fail "auto: no line with '$line'"
  done
  chosen=$(sed -n 's/^  chosen: \(tp=[0-9]*,pp=[0-9]*,dp=[0-9]*,zero=[0-9]\).*/\1/p' "$log")
  resolved=$(awk '/^\[parallel\]/{p=1} p&&/^tp = /{tp=$3} p&&/^pp = /{pp=$3} p&&/^dp = /{dp=$3; p=0}
                  /^\[zero\]/{z=1} z&&/^stage = /{stage=$3; z=0}
                  END{printf "tp=%s,pp=%s,dp=%s,zero=%s", tp, pp, dp, stage}' "$log")
  [ -n "$chosen" ] && [ "$chosen" = "$resolved" ] || fail "auto: chose '$chosen' but resolved '$resolved'"
  read -r first last < <(sed -n 's/^done: .*loss \([0-9.]*\) -> \([0-9.]*\).*/\1 \2/p' "$log")
  if [ -z "${last:-}" ] || ! awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < 0.8 * a)}'; then
    fail "auto: the loss did not fall (${first:-?} -> ${last:-?})"
  else
    echo "ok   auto: chose $chosen, loss $first -> $last"
  fi
else
  fail "auto: the run failed"; tail -20 "$work/auto.log"
fi

# 2. Keys the config sets are kept.
if run fixed 4 --set train.steps=2 --set zero.stage=1 --set parallel.pp=2 &&
   grep -qF "kept from the config: pp=2,zero=1" "$work/fixed.log" &&
   grep -qE "^  chosen: tp=[0-9]+,pp=2,dp=[0-9]+,zero=1," "$work/fixed.log"; then
  echo "ok   fixed keys kept"
else
  fail "fixed keys: not kept"; grep -E "kept|chosen|Error" "$work/fixed.log" | head -5
fi

# 2b. Manual mode with one key "auto": the planner chooses it alone, every other layout
#     key kept as configs/dp.toml gives it (tp 1, pp 1, grad_accum 1, ...).
if timeout 300 "${launch[@]}" -np 4 "$train" --config "$configs/dp.toml" --set 'zero.stage="auto"' \
     --set train.steps=2 >"$work/one_key.log" 2>&1 &&
   grep -qE '^# auto layout \(zero.stage = "auto" at --set' "$work/one_key.log" &&
   grep -qE "kept from the config: tp=1,pp=1,.*ga=1" "$work/one_key.log" &&
   grep -qE "^  chosen: tp=1,pp=1,dp=4,zero=[0-3],.*,mbs=8,ga=1$" "$work/one_key.log"; then
  echo "ok   one key \"auto\" in manual mode: $(sed -n 's/^  chosen: //p' "$work/one_key.log")"
else
  fail "one key auto"; grep -E "auto layout|kept|chosen|Error" "$work/one_key.log" | head -5
fi

# 3. A constraint no layout meets: every rank says so, the run ends.
run unmet 2 --set parallel.tp=3
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
   grep -q '^\[rank 0\] ConfigError: parallel.mode = "auto" at .*: no layout of 2 devices runs and fits with tp=3' \
     "$work/unmet.log" && grep -q '^\[rank 1\] ConfigError: parallel.mode = "auto"' "$work/unmet.log"; then
  echo "ok   an unmet constraint is refused on every rank"
else
  fail "unmet constraint (exit $rc)"; tail -5 "$work/unmet.log"
fi

# 3b. [auto] max_memory_gb is a cap: below what any layout needs, the nearest is named.
run capped 2 --set auto.max_memory_gb=0.0001
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
   grep -q '^\[rank 0\] ConfigError: parallel.mode = "auto" .*no layout of 2 devices runs and fits (.* scored); the nearest is tp=.*, out of memory by' \
     "$work/capped.log"; then
  echo "ok   auto.max_memory_gb caps the plan"
else
  fail "auto.max_memory_gb (exit $rc)"; tail -3 "$work/capped.log"
fi

# 4. Saved on 4 ranks, resumed on 2, each planned in auto mode.
if run save4 4 --set train.steps=10 --set logging.every=0 --set "logging.metrics_file=\"$work/save4.jsonl\"" \
       --set "checkpoint.dir=\"$work/ckpt\"" --set checkpoint.every=5 &&
   run resume2 2 --set train.steps=10 --set logging.every=0 --set "logging.metrics_file=\"$work/resume2.jsonl\"" \
       --set "checkpoint.load=\"$work/ckpt/step-000000000005\""; then
  if awk -v tolerance=1.5e-6 '
      function loss_of(line) { match(line, /"loss":[^,]+/); return substr(line, RSTART + 7, RLENGTH - 7) + 0 }
      function step_of(line) { match(line, /"step":[0-9]+/); return substr(line, RSTART + 7, RLENGTH - 7) + 0 }
      FNR == NR { want[step_of($0)] = loss_of($0); next }
      { d = loss_of($0) - want[step_of($0)]; if (d < 0) d = -d; d /= want[step_of($0)]; seen++; if (d > worst) worst = d }
      END { printf "[ figures  ] auto resume 4 -> 2 ranks: %d steps, worst relative loss difference %.1e\n", seen, worst
            exit !(seen == 5 && worst <= tolerance) }' "$work/save4.jsonl" "$work/resume2.jsonl"; then
    echo "ok   auto resume on another world size ($(sed -n 's/^  chosen: //p' "$work/save4.log" | cut -d, -f1-4) -> $(sed -n 's/^  chosen: //p' "$work/resume2.log" | cut -d, -f1-4))"
  else
    fail "auto resume: steps 6-10 differ"
  fi
else
  fail "auto resume: a run failed"; tail -20 "$work/save4.log" "$work/resume2.log"
fi

if [ "$failures" -ne 0 ]; then echo "$failures auto-layout case(s) failed"; exit 1; fi
echo "parallel.mode = \"auto\" plans, explains, keeps fixed keys, refuses the impossible and resumes elsewhere"
