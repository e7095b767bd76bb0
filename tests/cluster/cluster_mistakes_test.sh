#!/usr/bin/env bash
# The mistakes a user makes on a cluster, made on two genuine hosts (two_nodes.sh: node0
# and node1, each with its own host name, network and mounts). Each must end the job with
# an error that names the node and the fix, within a minute, on every rank:
#  1. a tensor-parallel degree larger than a node (tp = 4 on 2 + 2 ranks);
#  2. ranks that do not divide into the nodes as the layout needs (3 + 3 ranks, tp = 2);
#  3. nodes of different sizes (node1's hwloc reports another machine: HWLOC_SYNTHETIC);
#  4. offload.nvme_path missing on node1 alone (hidden there by a mount);
#  5. another build on node1 (another program mounted over the binary's path there);
#  6. another config on node1 (another file mounted over the config's path there).
# Exits 77 (skipped) where this machine cannot make namespaces, saying why.
# Usage: cluster_mistakes_test.sh <mpiexec> <train_gpt> <another Parallax program> <configs-dir>
set -u
train=$2 other_program=$3 configs=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/two_nodes.sh"
two_nodes_for_test
failures=0

# expect NAME MESSAGE-REGEX MPIRUN-ARGS...: the run fails within 60 s and every rank's log
# line carries the message (rank 0's at least, and no rank trains).
expect() {
  local name=$1 message=$2; shift 2
  local log="$work/$name.log" started=$SECONDS rc=0
  timeout 90 bash -c 'source "$0"; two_nodes_mpirun "$@"' "$here/two_nodes.sh" "$work" \
    --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "$@" >"$log" 2>&1 || rc=$?
  local took=$((SECONDS - started))
  if [[ "$rc" -ne 0 && "$took" -le 60 ]] && grep -qE "$message" "$log" && ! grep -q "^step 1/" "$log"; then
    echo "ok   $name: exit $rc in ${took} s: $(grep -oE "$message.*" "$log" | head -1 | cut -c1-240)"
  else
    echo "FAIL $name: exit $rc after ${took} s, expected /$message/"; grep -E "Error|error" "$log" | head -5; tail -3 "$log"
    failures=$((failures + 1))
  fi
}

# 1. and 2.: the layout against the real hosts.
expect tp-larger-than-a-node "tp = 4 needs 4 ranks on one node, but node 'node0' hosts ranks \{0,1\}" \
  -np 4 --host node0:2,node1:2 "$train" --config "$configs/tp.toml" --set parallel.tp=4
expect ranks-not-dividing-nodes "node 'node0' hosts ranks \{0,1,2\} \(3, not a multiple of 2\)" \
  -np 6 --host node0:3,node1:3 "$train" --config "$configs/tp.toml" --set parallel.dp=3 \
  --set train.global_batch_size=24

# 3. node1 is another machine to hwloc (its ranks read a synthetic topology).
two_nodes_env "$work" node1 "HWLOC_SYNTHETIC=pack:1 core:64 pu:1"
expect nodes-of-different-sizes "the nodes differ: node 'node1' has 64 cores .* but node 'node0' \(rank 0's\) has" \
  -np 4 --host node0:2,node1:2 "$train" --config "$configs/dp.toml"
: >"$work/node1.env"

# 4. The NVMe tier's directory exists on node0 only.
mkdir -p "$work/local/nvme"
two_nodes_exec "$work" node1 mount -t tmpfs -o size=1m tmpfs "$work/local"
expect nvme-path-missing-on-node1 "offload.nvme_path = \"$work/local/nvme\": .* on node1 cannot create" \
  -np 4 --host node0:2,node1:2 "$train" --config "$configs/offload.toml" \
  --set 'offload.optimizer="nvme"' --set "offload.nvme_path=\"$work/local/nvme\""
two_nodes_exec "$work" node1 umount "$work/local"

# 5. node1 runs another program from the same path.
two_nodes_exec "$work" node1 mount --bind "$other_program" "$train"
expect another-build-on-node1 "ranks run different programs: rank\(s\) \{2,3\} on node1 differ from rank 0 on node0" \
  -np 4 --host node0:2,node1:2 "$train" --config "$configs/dp.toml"
two_nodes_exec "$work" node1 umount "$train"

# 6. node1 reads another file at the config's path.
printf 'extends = "%s"\n' "$configs/dp.toml" >"$work/run.toml"
printf 'extends = "%s"\n[train]\nseed = 7\n' "$configs/dp.toml" >"$work/other.toml"
two_nodes_exec "$work" node1 mount --bind "$work/other.toml" "$work/run.toml"
expect another-config-on-node1 "ranks hold different configurations: rank\(s\) \{2,3\} on node1 differ from rank 0 on node0" \
  -np 4 --host node0:2,node1:2 "$train" --config "$work/run.toml"
two_nodes_exec "$work" node1 umount "$work/run.toml"

if [ "$failures" -ne 0 ]; then echo "$failures cluster mistake(s) not reported as they should be"; exit 1; fi
echo "every cluster mistake ends the job at once with an error naming the node"
