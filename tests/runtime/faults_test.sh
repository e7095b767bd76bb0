#!/usr/bin/env bash
# Faults injected into real mpirun jobs of tests/runtime/fault_trainer.cpp end the job
# promptly, non-zero, with a message that names the cause, and leave no process behind:
#   stop       a rank stalls (SIGSTOP) mid-training: every live rank ends within
#              comm.timeout_s + 5 s, naming the stalled rank ("rank R never joined ...")
#   exception  a rank's own error: the others stop at once, naming it ("rank R failed: ...")
#   kill       a rank dies (SIGKILL): mpirun ends the job, naming it
#   evaluate   at ZeRO-3 one rank evaluates alone (a forward under NoGradGuard, as a
#              trainer that evaluates on rank 0 only): the job ends within comm.timeout_s
#              + 5 s naming the evaluation, instead of that rank's gathers meeting the
#              others' training gathers
#   disk-full  a rank's file writes start failing (as on a full drive) mid-run: the NVMe
#              tier's next write, or the next checkpoint, fails; the others stop at once,
#              naming it, and the last complete checkpoint still exports whole
#   config     one rank started with another config: the ranks that differ are named
#   program    one rank started with another program (train_gpt): the same, for the build
#   nvme_path  a missing NVMe directory, or a file where it should be: the path is named
#   memory     memory.limit_mb below what a step needs: every rank stops, naming itself, the
#              phase (the forward, the backward), the request, what is live and the key
# over data parallelism, ZeRO-3 with its state offloaded to the host, and tensor
# parallelism; and a pipeline's stage stopped (below). Prints one line per case: the time from the fault to the job's end and
# the message. Mutants: a shutdown that waits its full fixed grace (the stop cases
# exceed the bound), a diagnosis that names no rank (the stop cases' pattern).
#
# With TRAIN_GPT, also a pipeline (configs/pp.toml, 1F1B over 2 stages) whose second
# stage is stopped from outside (kill -STOP) once it has trained a few steps.
#
#   faults_test.sh MPIEXEC FAULT_TRAINER CONFIG_DIR CHECKPOINT_TOOL [TRAIN_GPT]
# FAULTS_LOG_DIR=DIR keeps each case's whole log (every rank's lines) as DIR/NAME.log.
set -uo pipefail
MPIEXEC="$1"
TRAINER="$2"
CONFIGS="$3"
CHECKPOINT_TOOL="$4"
TRAIN_GPT="${5:-}"
TIMEOUT_S=5
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../rank_of_pid.sh"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/faults_test.XXXXXX")"
keep_logs() {
  [[ -n "${FAULTS_LOG_DIR:-}" ]] && mkdir -p "$FAULTS_LOG_DIR" && cp "$WORK"/*.log "$FAULTS_LOG_DIR"/ 2>/dev/null
  rm -rf "$WORK"
}
trap keep_logs EXIT
failures=0

# The trainer's command line for one MPMD part: FAULT RANK ARGS...
trainer() {
  local fault="$1" rank="$2"
  shift 2
  echo "$TRAINER" --config "$HERE/fault_trainer.toml" --set train.steps=400 --set "comm.timeout_s=$TIMEOUT_S" \
    --fault "$fault" --fault-rank "$rank" --fault-step 20 --fault-time "$WORK/fault_time" "$@"
}

# run_case NAME RANKS FAULT RANK PATTERN BOUND_S ARGS...: the job must fail within BOUND_S
# of the fault (of its start when FAULT is none), print a line matching PATTERN, and
# leave no fault_trainer process. RANKS "1+1": two parts, the second with ARGS; "1+gpt":
# the second part is TRAIN_GPT with ARGS.
run_case() {
  local name="$1" ranks="$2" fault="$3" rank="$4" pattern="$5" bound="$6"
  shift 6
  local started ended fault_at rc=0
  local -a launch
  if [[ "$ranks" == 1+1 ]]; then
    read -r -a first <<<"$(trainer "$fault" "$rank")"
    read -r -a second <<<"$(trainer "$fault" "$rank" "$@")"
    launch=(-np 1 "${first[@]}" : -np 1 "${second[@]}")
  elif [[ "$ranks" == 1+gpt ]]; then
    read -r -a first <<<"$(trainer "$fault" "$rank")"
    launch=(-np 1 "${first[@]}" : -np 1 "$TRAIN_GPT" "$@")
  else
    read -r -a one <<<"$(trainer "$fault" "$rank" "$@")"
    launch=(-np "$ranks" "${one[@]}")
  fi
  rm -f "$WORK/fault_time"
  started="$(date +%s.%N)"
  timeout 120 "$MPIEXEC" --oversubscribe --bind-to none "${launch[@]}" >"$WORK/$name.log" 2>&1 || rc=$?
  ended="$(date +%s.%N)"
  fault_at="$started"
  local since="fault"
  [[ -s "$WORK/fault_time" ]] && fault_at="$(cat "$WORK/fault_time")" || since="start"
  local took
  took="$(awk -v a="$fault_at" -v b="$ended" 'BEGIN { printf "%.1f", b - a }')"
  local message
  message="$(grep -m1 -E -- "$pattern" "$WORK/$name.log")"
  local why=""
  if [[ "$rc" == 0 ]]; then why="exit status 0"; fi
  if [[ "$rc" == 124 ]]; then why="a hang (killed after 120 s)"; fi
  if [[ -z "$why" ]] && awk -v t="$took" -v b="$bound" 'BEGIN { exit !(t > b) }'; then
    why="ended ${took} s after the $since, beyond ${bound} s"
  fi
  if [[ -z "$why" && -z "$message" ]]; then why="no line matches /$pattern/"; fi
  sleep 0.5
  # Exited children a container's init has not reaped yet (state Z) are gone already.
  local pid state
  for pid in $(pgrep -x -- "$(basename "$TRAINER")"); do
    state="$(ps -o stat= -p "$pid" | tr -d ' ')"
    [[ -z "$why" && -n "$state" && "$state" != Z* ]] && why="fault_trainer process $pid ($state) left behind"
  done
  if [[ -n "$why" ]]; then
    echo "FAIL $name: $why (exit $rc); log:"
    tail -30 "$WORK/$name.log"
    pkill -9 -x -- "$(basename "$TRAINER")" 2>/dev/null  # not -f: this script's own command line names it
    failures=$((failures + 1))
    return
  fi
  printf '[ figures  ] fault %-20s exit %-3s %5s s after the %-5s | %s\n' "$name" "$rc" "$took" "$since" \
    "$(sed -E "s/^ *//; s/^(\[rank [0-9]+\] [A-Za-z]+: )?//; s|$WORK/||g" <<<"$message" | cut -c1-220)"
}

BOUND=$((TIMEOUT_S + 5))
TP_PLAN='tensor_parallel.plan={"fc1"="column","fc2"="row"}'
run_case dp-stop 3 stop 1 "rank 1 never joined" "$BOUND"
run_case zero3-offload-stop 2 stop 1 "rank 1 never joined" "$BOUND" --set zero.stage=3 \
  --set 'offload.optimizer="cpu"' --set 'offload.param="cpu"'
run_case tp-stop 2 stop 0 "rank 0 never joined" "$BOUND" --set parallel.tp=2 --set "$TP_PLAN"
run_case dp-exception 3 exception 2 "rank 2 failed: .*injected exception" "$BOUND"
run_case zero3-exception 2 exception 0 "rank 0 failed: .*injected exception" "$BOUND" --set zero.stage=3
run_case dp-kill 3 kill 1 "rank 1 .*(signal 9|Killed|killed)" "$BOUND"
run_case zero3-evaluate-alone 2 evaluate 0 "evaluation forward at zero.stage = 3" "$BOUND" --set zero.stage=3
run_case config-differs 1+1 none 0 "ranks hold different configurations" 60 --set train.seed=7
run_case nvme-path-missing 2 none 0 "$WORK/absent" 60 --set zero.stage=2 --set 'offload.optimizer="nvme"' \
  --set "offload.nvme_path=\"$WORK/absent\""
touch "$WORK/a-file"
run_case nvme-path-a-file 2 none 0 "$WORK/a-file.*Not a directory" 60 --set zero.stage=2 \
  --set 'offload.optimizer="nvme"' --set "offload.nvme_path=\"$WORK/a-file\""
# The model's step peaks at 76 KiB of tensors per rank (the progress line's "tensors").
run_case memory-limit-backward 2 none 0 \
  "MemoryLimitError: allocating [0-9]+ bytes during the backward, with [0-9]+ bytes live, passes the limit of 62914 bytes \(memory.limit_mb = 0.06, rank [01] of 2\)" \
  60 --set zero.stage=3 --set memory.limit_mb=0.06
run_case memory-limit-forward 2 none 0 \
  "MemoryLimitError: allocating [0-9]+ bytes during the forward, .*\(memory.limit_mb = 0.04, rank [01] of 2\)" 60 \
  --set memory.limit_mb=0.04
mkdir -p "$WORK/nvme"
run_case zero3-nvme-disk-full 2 disk-full 1 "rank 1 failed: .*NVMe tier.*File too large" "$BOUND" \
  --set zero.stage=3 --set 'offload.optimizer="nvme"' --set 'offload.param="nvme"' \
  --set "offload.nvme_path=\"$WORK/nvme\""
# checkpoint-disk-full: steps 10 and 20 are saved; rank 1's writes fail from step 20 on,
# so the save of step 30 fails; step 20 must still export whole (every CRC checked).
run_case checkpoint-disk-full 2 disk-full 1 "failed on rank 1: cannot write .*File too large" "$BOUND" \
  --set "checkpoint.dir=\"$WORK/ckpt\"" --set checkpoint.every=10
exported="$("$CHECKPOINT_TOOL" export "$WORK/ckpt" "$WORK/last.safetensors" 2>&1)"
if grep -q "(step 20," <<<"$exported"; then
  printf '[ figures  ] fault %-20s the last complete checkpoint exports whole: %s\n' checkpoint-disk-full \
    "$(head -n1 <<<"$exported" | sed "s|$WORK/||")"
else
  echo "FAIL checkpoint-disk-full: the last complete checkpoint (step 20) does not export: $exported"
  failures=$((failures + 1))
fi
if [[ -n "$TRAIN_GPT" ]]; then
  run_case program-differs 1+gpt none 0 "ranks run different programs" 60 --config "$CONFIGS/pp.toml"
fi
# pipeline-stop: the second stage of a 1F1B pipeline stopped from outside.
if [[ -n "$TRAIN_GPT" ]]; then
  started="$(date +%s.%N)"
  timeout 120 "$MPIEXEC" --oversubscribe --bind-to none -np 2 "$TRAIN_GPT" --config "$CONFIGS/pp.toml" \
    --set train.steps=100000 --set "comm.timeout_s=$TIMEOUT_S" --set logging.every=0 \
    --set "logging.metrics_file=\"$WORK/pp.jsonl\"" >"$WORK/pipeline-stop.log" 2>&1 &
  job=$!
  # Wait for a few steps, then stop world rank 1 (found by its launcher's rank variable).
  for _ in $(seq 600); do [[ "$(wc -l <"$WORK/pp.jsonl" 2>/dev/null || echo 0)" -ge 3 ]] && break; sleep 0.1; done
  stopped=""
  for pid in $(pgrep -x -- "$(basename "$TRAIN_GPT")"); do
    if [[ "$(rank_of_pid "$pid")" == 1 ]]; then
      kill -STOP "$pid" && stopped="$pid" && date +%s.%N >"$WORK/fault_time"
    fi
  done
  rc=0
  wait "$job" || rc=$?
  ended="$(date +%s.%N)"
  took="$(awk -v a="$(cat "$WORK/fault_time" 2>/dev/null || echo "$started")" -v b="$ended" 'BEGIN { printf "%.1f", b - a }')"
  message="$(grep -m1 -E "^ *rank 1 never joined" "$WORK/pipeline-stop.log")"
  why=""
  [[ -z "$stopped" ]] && why="no rank 1 process found to stop"
  [[ -z "$why" && "$rc" == 0 ]] && why="exit status 0"
  if [[ -z "$why" ]] && awk -v t="$took" -v b="$BOUND" 'BEGIN { exit !(t > b) }'; then
    why="ended ${took} s after the fault, beyond ${BOUND} s"
  fi
  [[ -z "$why" && -z "$message" ]] && why="no line names rank 1"
  if [[ -n "$why" ]]; then
    echo "FAIL pipeline-stop: $why (exit $rc); log:"
    tail -30 "$WORK/pipeline-stop.log"
    pkill -9 -x "$(basename "$TRAIN_GPT")" 2>/dev/null
    failures=$((failures + 1))
  else
    printf '[ figures  ] fault %-20s exit %-3s %5s s after the fault | %s\n' pipeline-stop "$rc" "$took" \
      "$(sed -E 's/^ *//' <<<"$message" | cut -c1-220)"
  fi
fi
exit "$failures"
