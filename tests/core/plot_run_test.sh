#!/usr/bin/env bash
# scripts/plot_run.py draws a real run's metrics file: the GPT example trains 4 steps on
# 2 ranks with logging.metrics_file, and plot_run.py must write a PNG (its signature,
# and the 1500×420 pixels it draws at). Skipped (exit 77) without Debian's Python and its
# python3-matplotlib, which scripts/common.sh installs.
# Mutants this catches: a script that breaks on the file's fields (a renamed key, a
# null loss), or writes something other than a PNG.
#
#   plot_run_test.sh MPIEXEC TRAIN_GPT CONFIG_DIR SOURCE_DIR
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
CONFIGS="$3"
SOURCE="$4"
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 has no matplotlib (Debian's python3-matplotlib)"
  exit 77
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/plot_run_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -np 2 "$TRAIN" --config "$CONFIGS/gpt_base.toml" \
  --set train.steps=4 --set logging.every=0 --set "logging.metrics_file=\"$WORK/metrics.jsonl\"" \
  >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; echo "FAIL: training"; exit 1; }
# A diverged step's loss is null in the file: the plot must draw it as a gap.
sed '2s/"loss":[^,]*/"loss":null/' "$WORK/metrics.jsonl" >"$WORK/with_null.jsonl"
"$SOURCE/scripts/plot_run.py" "$WORK/with_null.jsonl" "$WORK/run.png"
/usr/bin/python3 - "$WORK/run.png" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
    sys.exit("FAIL: not a PNG")
width, height = struct.unpack(">II", data[16:24])
if (width, height) != (1500, 420):
    sys.exit(f"FAIL: {width}x{height} pixels, expected 1500x420")
print(f"plot_run.py wrote a {width}x{height} PNG ({len(data)} bytes)")
PY
