#!/usr/bin/env bash
# A rank killed in the middle of writing a checkpoint loses nothing that was saved: the
# GPT example (2 ranks, ZeRO-1) saves step 5; a second run resumes and trains to step
# 10, but rank 1 runs under a 32 KiB file-size limit with the default SIGXFSZ action, so
# the kernel kills it in the middle of writing its part of step 10 (a kill -9 at exactly
# that point, without a race). Asserts: the job fails (non-zero), step 10 is not
# published (at most a .partial directory), parallax_checkpoint still reads step 5 as
# the newest, and a third run resumes from it ("latest") and trains to step 10.
#
#   crash_test.sh MPIEXEC TRAIN_GPT PARALLAX_CHECKPOINT CONFIG_DIR
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
TOOL="$3"
CONFIGS="$4"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/crash_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
fail() {
  echo "FAIL: $*"
  cat "$WORK/run.log"
  exit 1
}
common=(--config "$CONFIGS/gpt_base.toml" --set logging.every=0 --set zero.stage=1 --set "checkpoint.dir=\"$WORK/ckpt\"")
train() {
  timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -np 2 "$@" >"$WORK/run.log" 2>&1
}

train "$TRAIN" "${common[@]}" --set train.steps=5 || fail "the first run"
# Rank 1 under the limit (bash's ulimit -f counts 1024-byte blocks). Over TCP, since Open
# MPI's shared-memory transport sizes a file of its own at start-up, which the limit forbids.
# shellcheck disable=SC2016
train --mca btl self,tcp bash -c 'if [[ "$OMPI_COMM_WORLD_RANK" == 1 ]]; then ulimit -f 32; fi; exec "$0" "$@"' "$TRAIN" "${common[@]}" \
  --set 'checkpoint.load="latest"' --set train.steps=10 && fail "the run whose rank 1 died mid-save exited 0"
grep -qi "signal 25\|file size limit" "$WORK/run.log" || fail "rank 1 was not killed by SIGXFSZ"
grep -q "resumed at step 5 " "$WORK/run.log" || fail "rank 1 died before training (not in the save)"
[[ -d "$WORK/ckpt/step-000000000010.partial" ]] || fail "rank 1 died before the save of step 10 began"
[[ ! -e "$WORK/ckpt/step-000000000010" ]] || fail "step 10 was published without rank 1's file"
"$TOOL" info "$WORK/ckpt" | head -n 1 | grep -q "step-000000000005: step 5," || fail "step 5 is not the newest loadable"
train "$TRAIN" "${common[@]}" --set 'checkpoint.load="latest"' --set train.steps=10 || fail "the resume after the crash"
grep -q "resumed at step 5 " "$WORK/run.log" || fail "did not resume at step 5"
echo "[ figures  ] crash: rank 1 killed (SIGXFSZ) while writing step 10; step 5 intact and resumed"
