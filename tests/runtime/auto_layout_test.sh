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
#     steps 6-10 match the saving run's within reshard_test's bound (1.5e-6 relative);
#  5. the layer times are kept in auto.profile_cache: a second run with the model of (1)
#     times nothing, reads every shape from the file and chooses the same layout; a
#     corrupt file is named, costs only the timing and is written anew; the runs' ends
#     record measured / predicted step time there, and the next run's prediction is
#     the model's times their median;
#  6. `parallax plan --profile FILE` plans from that file (its model and machine).
# Mutants caught: a fixed key overwritten by the planner (2), ranks planning apart
# (rank 0's figures not shared: layouts differ and the run refuses mismatched configs
# or hangs), an unmet constraint planned anyway (3), a cache written but never read (5: shapes
# timed again), a cache read under other conditions (5: another dtype reads nothing),
# ratios not recorded or not applied (5).
# Usage: auto_layout_test.sh <mpiexec> <train_gpt> <configs-dir> <parallax>
set -u
mpiexec=$1 train=$2 configs=$3 parallax=$4
launch=("$mpiexec" --oversubscribe --bind-to none)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

# run NAME RANKS ARGS...: train_gpt on configs/auto.toml, output in $work/NAME.log.
run() {
  local name=$1 ranks=$2; shift 2
  timeout 300 "${launch[@]}" -np "$ranks" "$train" --config "$configs/auto.toml" \
    --set "auto.profile_cache=\"$work/profiles\"" "$@" >"$work/$name.log" 2>&1
}
# shapes LOG: "TIMED READ" from the "measured:" line.
shapes() { sed -n 's/.* shape(s): \([0-9]*\) timed, \([0-9]*\) read from .*/\1 \2/p' "$1"; }

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
     --set train.steps=2 --set "auto.profile_cache=\"$work/profiles\"" >"$work/one_key.log" 2>&1 &&
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

# 5. The layer-time cache.
first_choice=$(sed -n 's/^  chosen: //p' "$work/auto.log")
read -r timed read_back < <(shapes "$work/auto.log")
profile=$(sed -n 's/^  measured: .* read from \([^ ]*\.pb\)$/\1/p' "$work/auto.log")
[ -f "$profile" ] || profile=
if [ "${timed:-0}" -gt 0 ] && [ "${read_back:-1}" -eq 0 ] && [ -n "$profile" ] && run again 4 --set train.steps=2; then
  read -r timed2 read2 < <(shapes "$work/again.log")
  again_choice=$(sed -n 's/^  chosen: //p' "$work/again.log")
  if [ "${timed2:-1}" -eq 0 ] && [ "${read2:-0}" -eq "$timed" ] && [ "$again_choice" = "$first_choice" ]; then
    echo "ok   second run: $read2 shapes read from $(basename "$profile"), none timed, same choice"
  else
    fail "profile cache: second run timed ${timed2:-?}, read ${read2:-?} of $timed; chose '$again_choice', first '$first_choice'"
  fi
else
  fail "profile cache: the first run timed ${timed:-?}, read ${read_back:-?}, file '${profile}'"
fi
# Earlier runs on 4 ranks recorded measured / predicted: the second run's prediction
# is the model's times their median.
if awk '/^  predicted step time: .* ms = the model.s .* ms x .*, the median measured \/ predicted of the last [1-8] run\(s\)/ {
          p = $4; m = $9; c = $12; sub(/,$/, "", c); found = 1; ok = (p - m * c < 0.01 * p && m * c - p < 0.01 * p) }
        END { exit !(found && ok) }' "$work/again.log"; then
  echo "ok   $(grep -o 'the model.s .* run(s)' "$work/again.log")"
else
  fail "step-time correction: the second run does not scale by the recorded ratios"; grep "predicted step time" "$work/again.log"
fi
if run bf16 4 --set train.steps=1 --set 'precision.dtype="bf16"' &&
   [ "$(shapes "$work/bf16.log" | cut -d' ' -f2)" = 0 ]; then
  echo "ok   another dtype reads nothing from the fp32 file"
else
  fail "profile cache: a bf16 run read the fp32 times"; shapes "$work/bf16.log"
fi
if [ -n "$profile" ]; then
  echo "not a profile" >"$profile"
  if run corrupt 4 --set train.steps=1 &&
     grep -qF "layer-time file not used: $profile: not a layer profile" "$work/corrupt.log" &&
     [ "$(shapes "$work/corrupt.log" | cut -d' ' -f2)" = 0 ] && run mended 4 --set train.steps=1 &&
     [ "$(shapes "$work/mended.log" | cut -d' ' -f1)" = 0 ]; then
    echo "ok   a corrupt file is named, re-timed and written anew"
  else
    fail "profile cache: corrupt file"; grep -E "measured|not used|Error" "$work/corrupt.log" "$work/mended.log" | head -5; ls -la "$work/profiles"
  fi
  # 6. parallax plan from the file: its model, dtype and machine (4 ranks of 1 node).
  if "$parallax" plan --profile "$profile" --global-batch 32 --top 3 >"$work/plan.txt" 2>&1 &&
     grep -qF "4 layers, hidden 64, 4 heads, vocabulary 64, sequence 32" "$work/plan.txt" &&
     grep -qF "on 1 x the machine of $profile (4 devices" "$work/plan.txt" &&
     ! "$parallax" plan --profile "$profile" --model gpt3-175b --global-batch 32 >"$work/plan_bad.txt" 2>&1 &&
     grep -qF "was measured for 4 layers" "$work/plan_bad.txt"; then
    echo "ok   parallax plan --profile plans from the measured times"
  else
    fail "parallax plan --profile"; cat "$work/plan.txt" "$work/plan_bad.txt" | head -5
  fi
fi

if [ "$failures" -ne 0 ]; then echo "$failures auto-layout case(s) failed"; exit 1; fi
echo "parallel.mode = \"auto\" plans, explains, keeps fixed keys, refuses the impossible and resumes elsewhere"
