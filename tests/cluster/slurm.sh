#!/usr/bin/env bash
# A real Slurm cluster for tests: munged, slurmctld and slurmd, each started in the
# foreground by the test (no systemd, no cgroups), all files in one directory of the
# caller's. One node (this host), or two: the genuine hosts of two_nodes.sh, a slurmd on
# each and the controller on node0. Source it (and two_nodes.sh for two), then:
#
#   slurm_available          exit status 0 when this machine can run it, else 1 with the reason
#   slurm_up DIR [HOSTS]     start the daemons (DIR: an empty directory; HOSTS: a directory
#                            two_nodes_up made, for the two-host cluster); exports SLURM_CONF
#   slurm_run DIR CMD...     run CMD (srun, sbatch, sinfo) where the controller is reachable:
#                            here, or inside node0, in the current directory
#   slurm_batch DIR ARGS...  sbatch ARGS, then wait for the job; status 0 if it succeeded
#   slurm_down DIR           cancel every job, stop the daemons (also call it from an EXIT trap,
#                            before two_nodes_down; should the caller be killed outright, a
#                            watcher does it)
#
# The cluster: its nodes with this machine's CPUs each, one partition "test", the
# controller and nodes on ports derived from the caller's pid so two runs do not meet.
# Containers allow no cgroups, so processes are tracked by ProctrackType=proctrack/linuxproc
# and bound by task/affinity (sched_setaffinity), and nothing is accounted. The TmpFS is
# DIR/nodetmp; on two hosts each mounts a tmpfs of its own there (in its mount namespace),
# since the PMIx plugin keeps per-step directories there under the same name on every
# node. Needs root: slurmd starts tasks as their user.

slurm_available() {
  local tool
  for tool in munged munge slurmctld slurmd srun sbatch squeue scancel sinfo; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (scripts/common.sh installs Slurm)"; return 1; }
  done
  [[ "$(id -u)" -eq 0 ]] || { echo "slurmd must run as root to start tasks"; return 1; }
  return 0
}

# slurm_on DIR NODE CMD...: CMD on NODE (inside its namespaces on the two-host cluster).
slurm_on() {
  local dir=$1 node=$2; shift 2
  local -a on
  slurm_where "$dir" "$node"
  "${on[@]}" "$@"
}

# slurm_where DIR NODE: sets the caller's array `on` to the prefix that runs a command on
# NODE (empty on the one-node cluster). Daemons start as "${on[@]}" daemon ... &, so that
# $! is the daemon itself (nsenter execs it), not a subshell.
slurm_where() {
  on=()
  if [[ -f "$1/hosts" ]]; then on=(nsenter -t "$(cat "$(cat "$1/hosts")/$2.pid")" -u -n -m --wd="$PWD" --); fi
}

slurm_run() {
  local dir=$1; shift
  slurm_on "$dir" "$(head -1 "$dir/nodes")" env SLURM_CONF="$dir/slurm.conf" "$@"
}

# slurm_batch DIR SBATCH-ARGS...: submits a batch job and waits for its end, polling the
# controller every 0.2 s (sbatch --wait backs off to tens of seconds); exit status 0 when
# the job completed with exit code 0.
slurm_batch() {
  local dir=$1 job state i; shift
  job=$(slurm_run "$dir" sbatch --parsable "$@") || return 1
  for i in $(seq 3000); do
    state=$(slurm_run "$dir" scontrol show job "${job%%;*}" 2>/dev/null)
    case "$state" in
      *JobState=PENDING* | *JobState=RUNNING* | *JobState=CONFIGURING* | *JobState=COMPLETING* | "") sleep 0.2 ;;
      *) break ;;
    esac
  done
  [[ "$state" == *"JobState=COMPLETED"* && "$state" == *" ExitCode=0:0"* ]]
}

slurm_up() {
  local dir=$1 hosts=${2:-} port i n node controller
  local -a nodes
  port=$(( 20000 + ($$ % 2000) * 2 ))
  mkdir -p "$dir/state" "$dir/log" "$dir/nodetmp" || return 1
  chmod 755 "$dir"
  if [[ -n "$hosts" ]]; then
    echo "$hosts" >"$dir/hosts"
    n=$(cat "$hosts/subnet")
    nodes=(node0 node1)
    controller="node0(10.77.$n.1)"
    printf 'NodeName=node0 NodeAddr=10.77.%s.1 CPUs=%s State=UNKNOWN\n' "$n" "$(getconf _NPROCESSORS_ONLN)" >"$dir/node-lines"
    printf 'NodeName=node1 NodeAddr=10.77.%s.2 CPUs=%s State=UNKNOWN\n' "$n" "$(getconf _NPROCESSORS_ONLN)" >>"$dir/node-lines"
  else
    nodes=("$(hostname -s)")
    controller="${nodes[0]}(127.0.0.1)"
    printf 'NodeName=%s NodeAddr=127.0.0.1 CPUs=%s State=UNKNOWN\n' "${nodes[0]}" "$(getconf _NPROCESSORS_ONLN)" >"$dir/node-lines"
  fi
  printf '%s\n' "${nodes[@]}" >"$dir/nodes"
  for node in "${nodes[@]}"; do
    mkdir -p "$dir/spool/$node" || return 1
    if [[ -n "$hosts" ]]; then slurm_on "$dir" "$node" mount -t tmpfs -o size=64m tmpfs "$dir/nodetmp" || return 1; fi
  done
  head -c 1024 /dev/urandom >"$dir/munge.key" && chmod 400 "$dir/munge.key" || return 1
  # One munged: its socket is a file, which every host's namespaces reach.
  munged --foreground --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed" --log-file="$dir/log/munged.log" \
    >"$dir/log/munged.out" 2>&1 &
  echo $! >"$dir/munged.daemon"
  cat >"$dir/slurm.conf" <<CONF
ClusterName=parallaxtest
SlurmctldHost=$controller
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
TmpFS=$dir/nodetmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
$(cat "$dir/node-lines")
PartitionName=test Nodes=ALL Default=YES MaxTime=30 State=UP OverSubscribe=YES
CONF
  export SLURM_CONF="$dir/slurm.conf"
  for i in $(seq 50); do [[ -S "$dir/munge.socket" ]] && break; sleep 0.1; done
  local -a on
  slurm_where "$dir" "${nodes[0]}"
  "${on[@]}" slurmctld -D -i -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 &
  echo $! >"$dir/slurmctld.daemon"
  for node in "${nodes[@]}"; do
    slurm_where "$dir" "$node"
    "${on[@]}" slurmd -D -N "$node" -f "$SLURM_CONF" >"$dir/log/slurmd.$node.out" 2>&1 &
    echo $! >"$dir/slurmd-$node.daemon"
  done
  # Should the caller die without its EXIT trap (killed by a timeout), this watcher stops
  # the daemons and removes DIR once it is gone.
  # (Started twice removed, so that no one killing the caller's process tree finds it.)
  local caller=$$
  ( ( trap '' INT TERM HUP
      while kill -0 "$caller" 2>/dev/null; do sleep 2; done
      slurm_down "$dir"; rm -rf "$dir" ) >/dev/null 2>&1 </dev/null & )
  # Ready once every node is idle in the partition (the controller has heard from each slurmd).
  local idle
  idle=$(printf 'idle %.0s' "${nodes[@]}")
  for i in $(seq 150); do
    [[ "$(slurm_run "$dir" sinfo -h -N -o %t 2>/dev/null | tr '\n' ' ')" == "$idle" ]] && return 0
    sleep 0.2
  done
  echo "Slurm did not come up in 30 s:"
  tail -n 5 "$dir"/log/*.log 2>/dev/null
  return 1
}

slurm_down() {
  local dir=$1 i daemon pid
  if [[ -f "$dir/slurm.conf" ]]; then
    slurm_run "$dir" scancel --full --quiet --user=root 2>/dev/null || true
    for i in $(seq 50); do
      [[ -z "$(slurm_run "$dir" squeue -h 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
  for daemon in "$dir"/slurmd-*.daemon "$dir/slurmctld.daemon" "$dir/munged.daemon"; do
    if [[ -f "$daemon" ]]; then
      pid=$(cat "$daemon")
      kill "$pid" 2>/dev/null || true  # (|| true: a caller under set -e must reach every daemon)
      for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      rm -f "$daemon"
    fi
  done
}
