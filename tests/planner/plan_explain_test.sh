#!/usr/bin/env bash
# The planner's model state is the engine's, byte for byte: for each cell, `parallax plan
# --evaluate config --json` predicts every pipeline stage's parameter, gradient and
# optimizer bytes, and the GPT example's --explain measures them on every rank (the
# engine's own accounting, itself asserted against ZeRO's formulas by the equivalence
# tests). Mutants caught: a tensor-parallel split counted on the wrong layers (the
# LayerNorms or row-split biases split), the pipeline cut by layer counts instead of
# parameters, a ZeRO stage's shard on the wrong buffer, offload's device bytes kept.
# Usage: plan_explain_test.sh <mpiexec> <train_gpt> <parallax> <configs-dir>
set -u
mpiexec=$1 train=$2 parallax=$3 configs=$4
launch=("$mpiexec" --oversubscribe --bind-to none)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# check <name> <ranks> <config> [--set key=value ...]
check() {
  local name=$1 ranks=$2 config=$3; shift 3
  local sets=("$@")
  if ! timeout 300 "${launch[@]}" -np "$ranks" "$train" --config "$config" "${sets[@]}" --set train.steps=1 --explain \
        >"$work/explain" 2>&1; then
    echo "FAIL $name: the run failed:"; tail -20 "$work/explain"; failures=$((failures + 1)); return
  fi
  if ! "$parallax" plan --config "$config" "${sets[@]}" --cluster cpu --devices-per-node "$ranks" \
        --evaluate config --json >"$work/plan" 2>&1; then
    echo "FAIL $name: parallax plan failed:"; cat "$work/plan"; failures=$((failures + 1)); return
  fi
  if python3 - "$work/explain" "$work/plan" "$name" <<'PY'; then echo "ok   $name"; else failures=$((failures + 1)); fi
import json, re, sys
explain = open(sys.argv[1]).read().splitlines()
plan = json.load(open(sys.argv[2]))
name = sys.argv[3]
# rank -> pipeline stage, from the mesh table ("rank host local tp pp dp").
stage_of = {}
start = next(i for i, line in enumerate(explain) if re.match(r"\s*rank\s+host\s+local\s+tp\s+pp\s+dp", line))
for line in explain[start + 1:]:
    fields = line.split()
    if len(fields) != 6 or not fields[0].isdigit():
        break
    stage_of[int(fields[0])] = int(fields[4])
# measured bytes per rank, from the table after "model state per rank".
start = next(i for i, line in enumerate(explain) if line.startswith("model state per rank"))
measured = {}
for line in explain[start + 2:]:
    m = re.match(r"\s*(\d+)\s+(\d+) \(\d+\)\s+(\d+) \(\d+\)\s+(\d+) \(\d+\)", line)
    if not m:
        break
    measured[int(m.group(1))] = tuple(int(g) for g in m.group(2, 3, 4))
predicted = plan["memory"]["state_per_stage"]
bad = []
for rank, got in sorted(measured.items()):
    want = predicted[stage_of[rank]]
    want = (want["params"], want["grads"], want["optimizer"])
    if got != want:
        bad.append(f"rank {rank} (stage {stage_of[rank]}): measured {got}, predicted {want}")
if not measured or bad:
    print(f"FAIL {name}: " + ("; ".join(bad) if bad else "no model-state table in --explain"))
    sys.exit(1)
PY
}

check "dp, ZeRO-0" 4 "$configs/dp.toml"
check "dp, ZeRO-1" 4 "$configs/dp.toml" --set zero.stage=1
check "dp, ZeRO-2" 4 "$configs/dp.toml" --set zero.stage=2
check "dp, ZeRO-3" 4 "$configs/dp.toml" --set zero.stage=3
check "dp, ZeRO-2, bf16" 4 "$configs/bf16.toml" --set zero.stage=2
check "dp, ZeRO-2, optimizer offloaded" 4 "$configs/offload.toml"
check "dp, ZeRO-3, optimizer and parameters offloaded" 4 "$configs/offload.toml" --set zero.stage=3 \
  --set 'offload.param="cpu"'
check "tp 2 x dp 2, ZeRO-1" 4 "$configs/tp.toml" --set zero.stage=1
check "pp 2 x dp 2" 4 "$configs/pp.toml"
check "pp 2 x dp 2, interleaved" 4 "$configs/pp.toml" --set 'pipeline.schedule="interleaved"' \
  --set pipeline.virtual_stages=2 --set model.n_layer=4
check "tp 2 x pp 2" 4 "$configs/3d.toml"
check "tp 2 x pp 2 x dp 2, ZeRO-1" 8 "$configs/3d.toml" --set zero.stage=1

if [ "$failures" -ne 0 ]; then
  echo "$failures cell(s) predicted wrongly"; exit 1
fi
echo "the planner's model state equals the engine's in every cell"
