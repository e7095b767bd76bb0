#!/usr/bin/env bash
# TensorBoard reads what a real run wrote (logging.tensorboard_dir):
#  1. the GPT example (configs/gpt_base.toml) trains 6 steps on 2 ranks with
#     logging.metrics_file and logging.tensorboard_dir set;
#  2. with PYTHON (an interpreter with the tensorboard package: the wheel build's
#     environment, which scripts/common.sh installs it into), or else python3 if it has
#     the package, tensorboard_readback.py reads the directory with TensorBoard's own
#     EventAccumulator: one file, every tag with one value per step, values equal to the
#     metrics file's. Without such a Python the test is skipped (exit 77).
# Mutants this catches: a field number TensorBoard does not know, zeros left out of the
# records, a step written under the wrong number, a value written under the wrong tag.
#
#   tensorboard_readback_test.sh MPIEXEC TRAIN_GPT CONFIG_DIR [PYTHON]
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
CONFIGS="$3"
PYTHON="${4:-}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "$PYTHON" ]] && python3 -c 'import tensorboard' 2>/dev/null; then PYTHON=python3; fi
if [[ -z "$PYTHON" ]]; then
  echo "SKIP: no Python with the tensorboard package (the wheel build's environment has it)"
  exit 77
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tensorboard_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -np 2 "$TRAIN" --config "$CONFIGS/gpt_base.toml" \
  --set train.steps=6 --set logging.every=0 --set "logging.metrics_file=\"$WORK/metrics.jsonl\"" \
  --set "logging.tensorboard_dir=\"$WORK/tensorboard\"" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; echo "FAIL: training"; exit 1; }
"$PYTHON" "$HERE/tensorboard_readback.py" "$WORK/tensorboard" "$WORK/metrics.jsonl"
