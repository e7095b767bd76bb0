#!/usr/bin/env bash
# The `parallax` command: its subcommands, help and errors, and `parallax plan`'s outputs
# as programs read them.
# Usage: parallax_cli_test.sh <parallax> <parallax-matrix> <configs-dir>
set -u
parallax=$1 matrix=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
# expect NAME STATUS PATTERN COMMAND...: exits STATUS, its output matches PATTERN.
expect() {
  local name=$1 status=$2 pattern=$3; shift 3
  "$@" >"$work/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$status" ] || ! grep -qE -- "$pattern" "$work/out"; then
    fail "$name: exit $rc (expected $status), output:"; head -5 "$work/out"
  else
    echo "ok   $name"
  fi
}

expect "help" 0 "^  plan " "$parallax" --help
expect "no command" 2 "^Usage: parallax <command>" "$parallax"
expect "unknown command" 2 "parallax: unknown command 'plna'" "$parallax" plna
expect "version" 0 "^parallax [0-9]+\.[0-9]+" "$parallax" --version
expect "plan help" 0 "--evaluate LAYOUT" "$parallax" plan --help
expect "plan: unknown option" 2 "UsageError: unknown option '--bogus'" "$parallax" plan --model gpt3-175b --bogus
expect "plan: unknown model" 2 "unknown model preset 'gpt5' \(known: megatron-1.7b" \
  "$parallax" plan --model gpt5 --global-batch 8
expect "plan: no batch" 2 "the global batch is not known" "$parallax" plan --model gpt3-175b
expect "plan: bad layout item" 2 "layout item 'zero=5': the ZeRO stage is 0, 1, 2 or 3" \
  "$parallax" plan --model megatron-1.7b --global-batch 64 --fix zero=5
expect "plan: a refused layout is scored and exits 1" 1 "refused by this build: pipeline stages on GPUs" \
  "$parallax" plan --model gpt3-175b --cluster dgx-a100-80gb --nodes 192 --global-batch 1536 \
  --evaluate "tp=8,pp=16,dp=12,recompute=full"
echo "not a profile" >"$work/bad.pb"
expect "plan: a file that is no layer profile is named" 1 "ConfigError: $work/bad.pb: not a layer profile" \
  "$parallax" plan --profile "$work/bad.pb" --global-batch 8
expect "plan: a missing layer profile is named" 1 "ConfigError: $work/none.pb: cannot read the layer profile" \
  "$parallax" plan --profile "$work/none.pb" --global-batch 8
expect "checkpoint runs parallax_checkpoint" 0 "export" "$parallax" checkpoint --help

if "$parallax" matrix >"$work/matrix" && "$matrix" >"$work/matrix-tool" && cmp -s "$work/matrix" "$work/matrix-tool"; then
  echo "ok   matrix prints what parallax-matrix prints"
else
  fail "matrix differs from parallax-matrix"
fi

# --json: every candidate's degrees multiply to the devices and its parts add up.
if "$parallax" plan --model megatron-1.7b --cluster dgx-a100-80gb --nodes 2 --global-batch 256 --json --top 20 \
     >"$work/plan.json" && python3 - "$work/plan.json" <<'PY'; then echo "ok   --json"; else fail "--json"; fi
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["scored"] > 0 and 0 < len(plan["candidates"]) <= 20, plan
times = [c["time"]["total_s"] for c in plan["candidates"]]
assert times == sorted(times), "not ranked by time"
for c in plan["candidates"]:
    assert c["tp"] * c["pp"] * c["dp"] == 16, c
    assert c["micro_batch_size"] * c["grad_accum"] * c["dp"] == 256, c
    m = c["memory"]
    assert m["device_total"] == m["params"] + m["grads"] + m["optimizer"] + m["activations"] + m["buffers"], m
    assert m["device_total"] <= 80e9 * 0.9, m
    assert c["refused"] == "" and c["does_not_fit"] == "", c
PY

# --emit-config: the written TOML loads back as the layout that was chosen.
if "$parallax" plan --config "$configs/dp.toml" --cluster cpu --emit-config "$work/planned.toml" >"$work/emit" &&
   chosen=$(sed -n 's/^ *1  \([^ ]*\) .*/\1/p' "$work/emit") &&
   "$parallax" plan --config "$work/planned.toml" --cluster cpu --evaluate config >"$work/again" &&
   [ "$(head -2 "$work/again" | tail -1)" = "$chosen" ]; then
  echo "ok   --emit-config writes the chosen layout ($chosen)"
else
  fail "--emit-config: chose '${chosen:-?}', the file says '$(head -2 "$work/again" 2>/dev/null | tail -1)'"
fi

if [ "$failures" -ne 0 ]; then echo "$failures parallax command case(s) failed"; exit 1; fi
echo "the parallax command answers as documented"
