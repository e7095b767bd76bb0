#!/usr/bin/env bash
# Every program Parallax builds for users answers --help and --version (exit 0, no MPI
# when launched alone, one answer under mpirun), a mistyped flag is an error that lists
# the known ones with a did-you-mean, and --config-reference prints docs/config.md.
# Mutants this catches: help printed by every rank under mpirun (the count of usage
# lines), a flag check that lets unknown flags through, a stale docs/config.md.
#
#   program_flags_test.sh MPIEXEC TRAIN_GPT PARALLAX_TRAIN PARALLAX_CHECKPOINT PARALLAX_MATRIX SOURCE_DIR
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
EXISTING="$3"
TOOL="$4"
MATRIX="$5"
SOURCE="$6"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/program_flags_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "FAIL: $*"
  exit 1
}

# answers NAME WHAT PROGRAM ARGS...: PROGRAM exits 0, its output (in $WORK/NAME) contains WHAT.
answers() {
  local name="$1" what="$2"
  shift 2
  local rc=0
  "$@" >"$WORK/$name" 2>&1 || rc=$?
  [[ "$rc" == 0 ]] || { cat "$WORK/$name"; fail "$name: exit $rc"; }
  grep -qF -- "$what" "$WORK/$name" || { cat "$WORK/$name"; fail "$name: no '$what'"; }
  echo "ok: $name ($(wc -l <"$WORK/$name") lines)"
}

answers train-help "--print-schedule" "$TRAIN" --help
grep -qF -- "--config FILE" "$WORK/train-help" || fail "train_gpt --help lists no --config"
grep -qF "[model], [data]" "$WORK/train-help" || fail "train_gpt --help names no app tables"
answers train-h "Usage: train_gpt" "$TRAIN" -h
answers train-version "LibTorch" "$TRAIN" --version
grep -q "^Parallax [0-9]" "$WORK/train-version" || fail "no version line"
grep -q "^NCCL: " "$WORK/train-version" || fail "no NCCL line"
answers existing-help "--config FILE" "$EXISTING" --help
answers tool-help "parallax_checkpoint export" "$TOOL" --help
answers tool-version "LibTorch" "$TOOL" --version
answers matrix-help "strategy matrix" "$MATRIX" --help

# Under mpirun the launcher's first rank answers; the others exit quietly.
answers mpirun-help "Usage:" "$MPIEXEC" --oversubscribe -np 2 "$TRAIN" --help
[[ "$(grep -c "^Usage:" "$WORK/mpirun-help")" == 1 ]] || fail "mpirun -np 2 --help printed the usage $(grep -c "^Usage:" "$WORK/mpirun-help") times"

# The reference is the committed file.
"$TRAIN" --config-reference >"$WORK/reference.md"
cmp -s "$WORK/reference.md" "$SOURCE/docs/config.md" ||
  fail "docs/config.md differs from train_gpt --config-reference; regenerate it: train_gpt --config-reference > docs/config.md"

# A mistyped flag: an error naming it, a suggestion and the known flags, before MPI starts.
if "$TRAIN" --explan >"$WORK/typo" 2>&1; then fail "train_gpt --explan was accepted"; fi
grep -qF "unknown flag '--explan'; did you mean '--explain'?" "$WORK/typo" || { cat "$WORK/typo"; fail "no did-you-mean"; }
grep -qF -- "--print-schedule" "$WORK/typo" || fail "the known flags are not listed"
if "$MATRIX" --bogus >"$WORK/matrix-bogus" 2>&1; then fail "parallax-matrix --bogus was accepted"; fi
echo "ok: unknown flags refused: $(head -1 "$WORK/typo")"
