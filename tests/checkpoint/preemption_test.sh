#!/usr/bin/env bash
# Preemption: a scheduler's signal to ONE rank makes every rank save at the next step
# boundary and the job exit 0, and the saved step resumes. Two cases on 2 ranks: SIGTERM
# to a data-parallel run (ZeRO-1) and SIGUSR1 to a pipeline run (pp 2, 1F1B). Each run
# is told to train far more steps than it gets to; after a few steps one rank (found by
# its launcher's rank variable, tests/rank_of_pid.sh) gets the signal. Asserts: mpirun exits 0 within 60 s, the log
# names the signal and the rank, the newest checkpoint holds the last step trained, and
# a run with checkpoint.load = "latest" resumes there.
# Mutants this catches: a handler that ends the process (the default), a signal only the
# receiving rank acts on (the others wait in the next collective: no exit 0, or a hang
# that the timeout ends), a save that skips the last step.
#
#   preemption_test.sh MPIEXEC TRAIN_GPT PARALLAX_CHECKPOINT CONFIG_DIR
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
TOOL="$3"
CONFIGS="$4"
source "$(dirname "${BASH_SOURCE[0]}")/../rank_of_pid.sh"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/preemption_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "FAIL: $*"
  [[ -f "$WORK/run.log" ]] && cat "$WORK/run.log"
  exit 1
}

# case NAME SIGNAL RANK ARGS...: train, signal RANK, check the save, resume.
preempt() {
  local name="$1" signal="$2" target="$3"
  shift 3
  local dir="$WORK/$name" metrics="$WORK/$name.jsonl"
  local common=(--config "$CONFIGS/gpt_base.toml" --set logging.every=0 --set "checkpoint.dir=\"$dir\"" "$@")
  "$MPIEXEC" --oversubscribe --bind-to none -np 2 "$TRAIN" "${common[@]}" --set train.steps=100000 \
    --set "logging.metrics_file=\"$metrics\"" >"$WORK/run.log" 2>&1 &
  local launcher=$!
  for _ in $(seq 600); do
    [[ -f "$metrics" && "$(wc -l <"$metrics")" -ge 3 ]] && break
    sleep 0.2
  done
  [[ -f "$metrics" && "$(wc -l <"$metrics")" -ge 3 ]] || fail "$name: no 3 steps within 120 s"
  local pid victim=""
  for pid in $(pgrep -P "$launcher"); do
    if [[ "$(rank_of_pid "$pid")" == "$target" ]]; then victim=$pid; fi
  done
  [[ -n "$victim" ]] || fail "$name: rank $target's process not found"
  kill "-$signal" "$victim"
  local waited=0
  while kill -0 "$launcher" 2>/dev/null && ((waited < 600)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -0 "$launcher" 2>/dev/null && { kill -9 "$launcher"; fail "$name: still running 60 s after SIG$signal"; }
  wait "$launcher" || fail "$name: mpirun exited $? after SIG$signal (expected 0)"
  grep -q "preempted (SIG$signal on rank $target)" "$WORK/run.log" || fail "$name: no line naming SIG$signal and rank $target"
  local last
  last="$(tail -n 1 "$metrics" | sed 's/.*"step":\([0-9]*\).*/\1/')"
  "$TOOL" info "$dir" | head -n 1 | grep -q ": step $last," || fail "$name: the newest checkpoint is not step $last"
  "$MPIEXEC" --oversubscribe --bind-to none -np 2 "$TRAIN" "${common[@]}" --set 'checkpoint.load="latest"' \
    --set "train.steps=$((last + 2))" >"$WORK/run.log" 2>&1 || fail "$name: the resumed run failed"
  grep -q "resumed at step $last " "$WORK/run.log" || fail "$name: did not resume at step $last"
  echo "[ figures  ] preemption $name: SIG$signal to rank $target after step $last; saved, exited 0 in $((waited / 10)).$((waited % 10)) s, resumed"
}

preempt dp2-zero1 TERM 1 --set zero.stage=1
preempt pp2-1f1b USR1 0 --set parallel.pp=2 --set 'pipeline.schedule="1f1b"'
