#!/usr/bin/env bash
# Bad launches fail fast and clearly on every rank: each case must exit non-zero within
# its time limit (never hang) and print the expected error from every rank named.
# Usage: bad_launch_test.sh <mpiexec> <train_gpt> <configs-dir>
set -u
mpiexec=$1 train=$2 configs=$3
launch=("$mpiexec" --oversubscribe --bind-to none)
failures=0

# expect_failure <name> <pattern-per-rank...> -- <mpirun arguments...>
expect_failure() {
  local name=$1; shift
  local patterns=()
  while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
  shift
  local output rc
  output=$(timeout 120 "${launch[@]}" "$@" 2>&1); rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "FAIL $name: exit status 0, expected a failure"; failures=$((failures + 1)); return
  fi
  if [ "$rc" -eq 124 ]; then
    echo "FAIL $name: timed out (a hang)"; failures=$((failures + 1)); return
  fi
  for pattern in "${patterns[@]}"; do
    if ! grep -qE -- "$pattern" <<<"$output"; then
      echo "FAIL $name: no line matches /$pattern/ in:"; echo "$output" | tail -20
      failures=$((failures + 1)); return
    fi
  done
  echo "ok   $name (exit $rc)"
}

# Degrees that do not divide the world: every rank says so.
expect_failure "tp does not divide world" \
  '\[rank 0\] ConfigError: .*parallel.tp \(2\)' '\[rank 1\] ConfigError: .*parallel.tp \(2\)' '\[rank 2\] ConfigError: .*parallel.tp \(2\)' -- \
  -np 3 "$train" --config "$configs/dp.toml" --set parallel.tp=2

# The batch does not split over the ranks: 32 samples over 3 data-parallel ranks.
expect_failure "batch does not divide" \
  '\[rank 0\] ConfigError: .*global_batch_size' '\[rank 2\] ConfigError: .*global_batch_size' -- \
  -np 3 "$train" --config "$configs/dp.toml"

# Ranks launched with different configs: every rank reports the mismatch.
expect_failure "configs differ across ranks" \
  '\[rank 0\] ConfigError: ranks hold different configurations' \
  '\[rank 1\] ConfigError: ranks hold different configurations' -- \
  -np 1 "$train" --config "$configs/dp.toml" --set train.steps=3 : \
  -np 1 "$train" --config "$configs/dp.toml" --set train.steps=4

# One rank cannot read its config: it names the file, the others say why they stop.
expect_failure "config missing on one rank" \
  '\[rank 1\] ConfigError: .*/no/such/config.toml' '\[rank 0\] ConfigError: loading the configuration failed on 1 other rank' -- \
  -np 1 "$train" --config "$configs/dp.toml" : -np 1 "$train" --config /no/such/config.toml

# The NVMe tier's directory does not exist: every rank names it at engine creation.
expect_failure "nvme_path missing" \
  '\[rank 0\] ConfigError: offload.nvme_path = "/no/such/dir": rank 0' \
  '\[rank 1\] ConfigError: offload.nvme_path = "/no/such/dir": rank 1' -- \
  -np 2 "$train" --config "$configs/offload.toml" --set 'offload.optimizer="nvme"' --set 'offload.nvme_path="/no/such/dir"'

# A tensor-parallel plan that cannot split the model: every rank names the rule and module.
expect_failure "plan split does not divide" \
  '\[rank 0\] ConfigError: tensor_parallel.plan."blocks.\*.fc" at .*tp.toml:[0-9]+:[0-9]+: blocks.0.fc has 130 output features, which do not divide by parallel.tp = 4' \
  '\[rank 3\] ConfigError: tensor_parallel.plan."blocks.\*.fc"' -- \
  -np 4 "$train" --config "$configs/tp.toml" --set parallel.tp=4 --set model.d_ff=130

# Pipelines: a stage count that does not divide the ranks, a schedule that does not
# exist, more stages than layers: every rank says what and why.
expect_failure "pp does not divide world" \
  '\[rank 0\] ConfigError: .*parallel.pp \(2\) = 2 does not divide the world size \(3 ranks\)' \
  '\[rank 2\] ConfigError: .*parallel.pp \(2\)' -- \
  -np 3 "$train" --config "$configs/pp.toml"
expect_failure "unknown schedule" \
  '\[rank 0\] ConfigError: pipeline.schedule = "1f2b" .*did you mean "1f1b"\?' '\[rank 1\] ConfigError: pipeline.schedule' -- \
  -np 2 "$train" --config "$configs/pp.toml" --set 'pipeline.schedule="1f2b"'
expect_failure "more stages than layers" \
  '\[rank 0\] ConfigError: parallel.pp = 4 pipeline stages need at least 4 layers' \
  '\[rank 3\] ConfigError: parallel.pp = 4 pipeline stages need at least 4 layers' -- \
  -np 4 "$train" --config "$configs/pp.toml" --set parallel.pp=4 --set model.n_layer=1

# The strategy matrix refuses on every rank, before the resolved config is printed or a
# model is built.
expect_failure "sequence parallelism without a plan is refused" \
  '\[rank 0\] ConfigError: this strategy is refused: tensor_parallel.sequence_parallel = true at --set.*, parallel.tp = 2 at --set.*: the hand-written tensor_parallel/ layers are not sequence-parallel' \
  '\[rank 1\] ConfigError: this strategy is refused' -- \
  -np 2 "$train" --config "$configs/dp.toml" --set parallel.tp=2 --set tensor_parallel.sequence_parallel=true
if output=$(timeout 120 "${launch[@]}" -np 2 "$train" --config "$configs/dp.toml" --set parallel.tp=2 \
              --set tensor_parallel.sequence_parallel=true 2>&1) ||
   grep -q "# resolved configuration" <<<"$output"; then
  echo "FAIL refusal comes first: the run printed its config or succeeded"; failures=$((failures + 1))
else
  echo "ok   refusal comes before the resolved config is printed"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures bad-launch case(s) failed"; exit 1
fi
echo "all bad-launch cases failed cleanly, as they should"
