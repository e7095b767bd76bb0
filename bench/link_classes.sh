#!/usr/bin/env bash
# The two link classes on two genuine hosts (tests/cluster/two_nodes.sh: node0 and node1,
# Linux namespaces joined by a veth pair): bench_allreduce on 2 ranks within node0 (Open
# MPI's shared memory) and on 2 ranks, one per host (TCP over the link), same sizes, same
# run; then the ratio of their bus bandwidths. What the auto-planner calibrates as "within
# a node" and "between nodes" (runtime/layer_profile.cpp). On a real cluster the second
# class is the NIC; here it is the kernel's TCP stack over a memory-backed link.
#
#   bench/link_classes.sh [bench_allreduce flags]     (as root; after scripts/build.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh
source tests/cluster/two_nodes.sh
bench="$PWD/$BUILD_DIR/bench/bench_allreduce"
[[ -x "$bench" ]] || { echo "build first: scripts/build.sh (no $bench)" >&2; exit 1; }
if ! why=$(two_nodes_available); then echo "cannot make two hosts here: $why" >&2; exit 1; fi
work=$(mktemp -d)
trap 'two_nodes_down "$work"; rm -rf "$work"' EXIT
two_nodes_up "$work"
flags=("$@")
[[ ${#flags[@]} -eq 0 ]] && flags=(--min-kb 16 --max-mb 64)
for class in within between; do
  hosts=node0:2
  [[ "$class" == between ]] && hosts=node0:1,node1:1
  echo "== $class: 2 ranks on $hosts"
  two_nodes_mpirun "$work" --bind-to none -x OMP_NUM_THREADS=1 -np 2 --host "$hosts" "$bench" "${flags[@]}" |
    tee "$work/$class.txt" | grep -E "^ +[0-9]+ [KM]iB"
done
echo "size       within GB/s  between GB/s  within / between (Parallax's all_reduce, bus bandwidth)"
join <(awk '/^ +[0-9]+ [KM]iB/ { print $1 $2, $5 }' "$work/within.txt") \
     <(awk '/^ +[0-9]+ [KM]iB/ { print $1 $2, $5 }' "$work/between.txt") |
  awk '{ printf "%-10s %11.3f  %12.3f  %.1fx\n", $1, $2, $3, ($3 > 0 ? $2 / $3 : 0) }'
