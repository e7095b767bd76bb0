#!/usr/bin/env bash
# train_gpt --explain on an emulated 2-node cluster (the command docs/strategy-matrix-and-placement.md shows): exits 0 after printing the plan
# (every rank's coordinates, node, cores, device, groups) and, after one step, every
# rank's model-state bytes equal to ZeRO's formula and the bytes its groups moved.
# Usage: explain_test.sh <mpiexec> <train_gpt> <configs-dir>
set -u
mpiexec=$1 train=$2 configs=$3
# The plan is read from stdout alone: mpirun forwards each rank's stderr on its own, so a
# warning (e.g. OpenBLAS's kernel advice) can land in the middle of a row of the table.
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
output=$(timeout 300 "$mpiexec" --oversubscribe --bind-to none -np 8 "$train" --config "$configs/3d.toml" \
           --set zero.stage=1 --set topology.emulate_nodes=2 --set topology.emulate_rank_order='"round_robin"' \
           --explain 2>"$errors")
rc=$?
fail() { echo "FAIL: $1"; echo "$output" | tail -40; echo "--- stderr"; tail -20 "$errors"; exit 1; }
[ "$rc" -eq 0 ] || fail "exit status $rc"
grep -q "^# plan: tp 2 x pp 2 x dp 2 (tp-dp-pp) on 8 ranks, 2 emulated node(s); tensor-parallel groups cut from each node's own ranks" \
  <<<"$output" || fail "no plan line"
# Round robin: node0 holds ranks 0, 2, 4, 6, cut into tensor-parallel pairs {0,2} {4,6}.
grep -qE "^  0 +0 +0 +0 +node0 +0 +0-3 +0 +gpu0 +tp\[pp=0,dp=0\]" <<<"$output" || fail "rank 0's row"
grep -qE "^  2 +1 +0 +0 +node0 +1 +4-7 +0 +gpu1 +tp\[pp=0,dp=0\]" <<<"$output" || fail "rank 2's row"
grep -qE "^  7 +1 +1 +1 +node1 +3 +12-15 +1 +gpu3 +tp\[pp=1,dp=1\]" <<<"$output" || fail "rank 7's row"
# Each group's bytes, with those that reached the other (emulated) node in parentheses:
# the tensor- and data-parallel pairs are inside a node, the pipeline's two stages are not.
rows=$(grep -cE "^  [0-7] +([0-9]+) \(\1\) +([0-9]+) \(\2\) +([0-9]+) \(\3\) +[1-9][0-9]* \(0\) +([1-9][0-9]*) \(\4\) +[1-9][0-9]* \(0\)$" \
       <<<"$output")
[ "$rows" -eq 8 ] ||
  fail "expected 8 model-state rows equal to the formula, traffic in every group, only the pipeline's crossing nodes; got $rows"
grep -q "^bytes each rank sent in the step within its node and to other nodes" <<<"$output" ||
  fail "no table of the bytes sent within and across nodes"

# Context parallelism (cp 2 x dp 2, ZeRO-1): the plan names cp's coordinate and group, the
# state is sharded over the 4 replicas (dp x cp) as ZeRO's formula says, and the replicas
# and the cp group (the ring's key/value blocks) both moved bytes.
output=$(timeout 300 "$mpiexec" --oversubscribe --bind-to none -np 4 "$train" --config "$configs/dp.toml" \
           --set parallel.cp=2 --set zero.stage=1 --explain 2>"$errors")
rc=$?
[ "$rc" -eq 0 ] || fail "cp: exit status $rc"
grep -q "^  context parallel: cp 2, ring attention, load-balanced split of batch dimension 1; gradients reduced over dp x cp = 4 ranks" \
  <<<"$output" || fail "cp: no context-parallel line"
grep -qE "^  3 +0 +0 +1 +1 +.* +cp\[tp=0,pp=0,dp=1\]$" <<<"$output" || fail "cp: rank 3's row"
rows=$(grep -cE "^  [0-3] +([0-9]+) \(\1\) +([0-9]+) \(\2\) +([0-9]+) \(\3\) +0 \(0\) +0 \(0\) +[1-9][0-9]* \(0\) +[1-9][0-9]* \(0\)$" \
       <<<"$output")
[ "$rows" -eq 4 ] || fail "cp: expected 4 model-state rows equal to the formula over dp x cp, traffic in the replicas and cp; got $rows"
echo "ok: the plan and one step's model state, traffic per group and by node, with and without cp"
