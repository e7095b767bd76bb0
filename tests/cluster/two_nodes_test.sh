#!/usr/bin/env bash
# Parallax on two genuine hosts (tests/cluster/two_nodes.sh: namespaces node0 and node1,
# their own host names and network stacks, one veth link between them):
#  1. they are two hosts to Open MPI: with shared memory as the only transport
#     (--mca btl self,vader) ranks on node0 and node1 cannot reach each other;
#  2. configs/3d.toml on 8 ranks (4 per host) places the mesh from the hosts it finds,
#     not from emulate_* keys: every tensor-parallel pair on one host, the two pipeline
#     stages on different hosts;
#  3. the 3D equivalence cells (tp 2 × pp 2 × dp 2, without and with ZeRO-1) match the
#     single-process run with every cross-host byte over TCP.
# Exits 77 (skipped) where this machine cannot make namespaces, saying why.
# Usage: two_nodes_test.sh <mpiexec> <train_gpt> <matrix_equivalence_test> <configs-dir>
set -u
train=$2 equivalence=$3 configs=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/two_nodes.sh"
if ! why=$(two_nodes_available); then echo "SKIP: $why"; exit 77; fi
work=$(mktemp -d)
trap 'two_nodes_down "$work"; rm -rf "$work"' EXIT
two_nodes_up "$work" || { echo "FAIL could not make the two hosts"; exit 1; }
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
across() { timeout 300 bash -c 'source "$0"; two_nodes_mpirun "$@"' "$here/two_nodes.sh" "$work" \
  --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "$@"; }

# 1. Shared memory cannot join them.
if across -np 2 --host node0,node1 --mca btl self,vader "$train" --config "$configs/dp.toml" \
     --set train.steps=1 >"$work/vader.log" 2>&1; then
  fail "ranks on node0 and node1 reached each other through shared memory"
elif grep -q "unable to reach each other" "$work/vader.log"; then
  echo "ok   node0 and node1 are two hosts: shared memory cannot join them"
else
  fail "the shared-memory-only run failed otherwise"; tail -5 "$work/vader.log"
fi

# 2. The mesh from the real hosts.
if across -np 8 --host node0:4,node1:4 "$train" --config "$configs/3d.toml" --set train.steps=3 \
     >"$work/3d.log" 2>&1; then
  if awk '/^  rank  host   local  tp  pp  dp$/ { table = 1; next }
          table && NF == 6 && $1 ~ /^[0-9]+$/ { host[$1] = $2; pp[$1] = $5; dp[$1] = $6; n++; next }
          { table = 0 }
          END {
            if (n != 8) exit 1
            for (r in host) for (s in host) {
              if (pp[r] == pp[s] && dp[r] == dp[s] && host[r] != host[s]) exit 1  # a tp pair split
              if (pp[r] != pp[s] && host[r] == host[s]) exit 1                     # stages share a host
            }
          }' "$work/3d.log" && grep -q "^  node0: .*ranks {0,1,2,3}" "$work/3d.log" &&
     grep -q "^  node1: .*ranks {4,5,6,7}" "$work/3d.log"; then
    echo "ok   3d.toml: tp pairs inside node0 and node1, pipeline stages across ($(grep -o 'done: .*' "$work/3d.log"))"
  else
    fail "3d.toml: the mesh does not follow the hosts"; grep -A10 "^# mesh" "$work/3d.log" | head -12
  fi
else
  fail "3d.toml across two hosts failed"; tail -10 "$work/3d.log"
fi

# 3. Equivalence with one process, across the hosts.
if across -np 8 --host node0:4,node1:4 "$equivalence" \
     --gtest_filter='TensorParallelPipelines/*/tp2_pp2:TensorParallelPipelines/*/tp2_pp2_zero1' \
     >"$work/equivalence.log" 2>&1 && grep -q "PASSED.*2 tests" "$work/equivalence.log"; then
  grep -m2 "^\[ figures  \]" "$work/equivalence.log" | sed 's/\[ figures  \]/[ figures  ] across node0 and node1:/'
  echo "ok   tp 2 x pp 2 x dp 2 (and with ZeRO-1) match one process across two hosts"
else
  fail "3D equivalence across two hosts"; grep -E "FAILED|Failure|Error" "$work/equivalence.log" | head -5
fi

if [ "$failures" -ne 0 ]; then echo "$failures two-node case(s) failed"; exit 1; fi
echo "two genuine hosts: distinct to Open MPI, the mesh placed by them, 3D training equal to one process"
