#!/usr/bin/env bash
# Parallax on two genuine hosts (tests/cluster/two_nodes.sh: namespaces node0 and node1,
# their own host names and network stacks, one veth link between them):
#  1. they are two hosts to Open MPI: with shared memory as the only transport
#     (--mca btl self,vader) ranks on node0 and node1 cannot reach each other;
#  2. configs/3d.toml on 8 ranks (4 per host) places the mesh from the hosts it finds,
#     not from emulate_* keys: every tensor-parallel pair on one host, the two pipeline
#     stages on different hosts;
#  3. the 3D equivalence cells (tp 2 × pp 2 × dp 2, without and with ZeRO-1) match the
#     single-process run with every cross-host byte over TCP;
#  4. the traffic by node: no tensor- or data-parallel byte left its node, and the bytes the
#     link between the hosts carried match the counters' inter-node bytes;
#  5. the auto-planner finds the two hosts and times the link within a host and between them.
# Exits 77 (skipped) where this machine cannot make namespaces, saying why.
# Usage: two_nodes_test.sh <mpiexec> <train_gpt> <matrix_equivalence_test> <configs-dir>
set -u
train=$2 equivalence=$3 configs=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/two_nodes.sh"
two_nodes_for_test
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

# 4. Traffic by node: the counters' split, and the link's own byte count.
#    --explain's table: every rank's tensor- and data-parallel bytes stayed on its node (0 in
#    parentheses), every pipeline byte crossed (3d.toml's two stages are on different hosts).
if across -np 8 --host node0:4,node1:4 "$train" --config "$configs/3d.toml" --explain >"$work/explain.log" 2>&1 &&
   awk '/^model state per rank/ { table = 1; next }
        table && $1 == "rank" { next }
        table && $1 ~ /^[0-9]+$/ {
          rows++
          # columns: rank, 3 x "held (formula)", then "tp (across)", "pp (across)", "dp (across)"
          tp_across = $9; pp = $10; pp_across = $11; dp_across = $13
          if (tp_across != "(0)" || dp_across != "(0)" || pp_across != "(" pp ")" || pp == 0) bad++
          next }
        table { table = 0 }
        END { exit !(rows == 8 && bad == 0) }' "$work/explain.log"; then
  echo "ok   --explain: every tensor- and data-parallel byte stayed on its node, every pipeline byte crossed"
else
  fail "--explain's traffic by node"; grep -A10 "^model state per rank" "$work/explain.log"
fi
#    The link: what crossed between node0 and node1 during steps 3..10 (a 10-step run less a
#    2-step one, both directions, as the veth link counts it) against the counters' inter-node
#    bytes of those steps (every op but recv, all ranks). The link also carries TCP/IP and Open
#    MPI's fragment headers and the per-step telemetry, measured at 2% here: so between 1x and
#    1.1x. Mutants caught: groups whose nodes were never set (nothing counted as crossing), an
#    uncounted operation crossing, a tensor-parallel group split over the hosts (--explain).
link_bytes() { nsenter -t "$(cat "$work/node0.pid")" -n cat /proc/net/dev |
                 awk -v dev="pxa$(cat "$work/subnet"):" '$1 == dev { print $2 + $10 }'; }
linked=()
for steps in 2 10; do
  before=$(link_bytes)
  across -np 8 --host node0:4,node1:4 "$train" --config "$configs/3d.toml" --set train.steps=$steps \
    --set logging.every=0 --set "logging.metrics_file=\"$work/metrics$steps.jsonl\"" >"$work/link$steps.log" 2>&1 ||
    fail "the $steps-step run for the link count failed"
  linked+=($(( $(link_bytes) - before )))
done
measured=$(( linked[1] - linked[0] ))
counted=$(python3 -c '
import json, sys
total = 0
for line in open(sys.argv[1]):
    step = json.loads(line)
    if step["step"] >= 3:
        total += sum(c["inter_node_bytes"] for rank in step["comm"] for op, c in rank.items() if op != "recv")
print(total)' "$work/metrics10.jsonl")
if (( counted > 0 && measured >= counted && measured * 10 <= counted * 11 )); then
  echo "ok   steps 3..10 crossed the link with $measured bytes for the $counted inter-node bytes counted" \
       "(x$(python3 -c "print(f'{$measured / $counted:.4f}')"))"
else
  fail "the link carried $measured bytes in steps 3..10 but the counters say $counted crossed"
fi

# 5. The auto-planner finds the two hosts and times both link classes: an all-reduce within
#    each host (shared memory) and one between them (TCP). Which is faster is not asserted:
#    on oversubscribed cores the timings overlap (between-host latency 1.7-17x the
#    within-host one, bandwidth either way round, over the runs here).
if across -np 8 --host node0:4,node1:4 "$train" --config "$configs/auto.toml" --set train.steps=1 \
     --set 'auto.profile_cache="none"' >"$work/auto.log" 2>&1 &&
   figures=$(grep -oE "links [0-9.]+ GB/s, [0-9.]+ us within a node, [0-9.]+ GB/s, [0-9.]+ us between nodes" \
               "$work/auto.log") &&
   grep -q "measured: 2 node(s) x 4 rank(s)" "$work/auto.log" &&
   awk '{ exit !($2 > 0 && $4 > 0 && $9 > 0 && $11 > 0) }' <<<"$figures"; then
  echo "ok   auto: two nodes found, $figures"
else
  fail "auto's link classes across the hosts"; grep -E "measured:|Error" "$work/auto.log" | head -3
fi

if [ "$failures" -ne 0 ]; then echo "$failures two-node case(s) failed"; exit 1; fi
echo "two genuine hosts: distinct to Open MPI, the mesh placed by them, 3D training equal to one process, traffic by node exact"
