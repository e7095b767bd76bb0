#!/usr/bin/env bash
# A real single-node Slurm cluster for tests: munged, slurmctld and slurmd, each started
# in the foreground by the test (no systemd, no cgroups), all files in one directory of
# the caller's. Source it, then:
#
#   slurm_available        exit status 0 when this machine can run it, else 1 with the reason
#   slurm_up DIR           start the daemons (DIR: an empty directory); exports SLURM_CONF
#   slurm_down DIR         cancel every job, stop the daemons (also call it from an EXIT trap;
#                          should the caller be killed outright, a watcher does it)
#
# The cluster: one node named after this host (NodeAddr 127.0.0.1) with this machine's
# CPUs, one partition "test", the controller and node on ports derived from the caller's
# pid so two runs do not meet. Containers allow no cgroups, so processes are tracked by
# ProctrackType=proctrack/linuxproc and bound by task/affinity (sched_setaffinity), and
# nothing is accounted. Needs root: slurmd starts tasks as their user.

slurm_available() {
  local tool
  for tool in munged munge slurmctld slurmd srun sbatch squeue scancel sinfo; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (scripts/common.sh installs Slurm)"; return 1; }
  done
  [[ "$(id -u)" -eq 0 ]] || { echo "slurmd must run as root to start tasks"; return 1; }
  return 0
}

slurm_up() {
  local dir=$1 host port i
  host=$(hostname -s)
  port=$(( 20000 + ($$ % 2000) * 2 ))
  mkdir -p "$dir/state" "$dir/spool" "$dir/log" || return 1
  chmod 755 "$dir"
  head -c 1024 /dev/urandom >"$dir/munge.key" && chmod 400 "$dir/munge.key" || return 1
  munged --foreground --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed" --log-file="$dir/log/munged.log" \
    >"$dir/log/munged.out" 2>&1 &
  echo $! >"$dir/munged.daemon"
  cat >"$dir/slurm.conf" <<CONF
ClusterName=parallaxtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=30 State=UP OverSubscribe=YES
CONF
  export SLURM_CONF="$dir/slurm.conf"
  for i in $(seq 50); do [[ -S "$dir/munge.socket" ]] && break; sleep 0.1; done
  slurmctld -D -i -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 &
  echo $! >"$dir/slurmctld.daemon"
  slurmd -D -N "$host" -f "$SLURM_CONF" >"$dir/log/slurmd.out" 2>&1 &
  echo $! >"$dir/slurmd.daemon"
  # Should the caller die without its EXIT trap (killed by a timeout), this watcher stops
  # the daemons and removes DIR once it is gone.
  local caller=$$
  # (Started twice removed, so that no one killing the caller's process tree finds it.)
  ( ( trap '' INT TERM HUP
      while kill -0 "$caller" 2>/dev/null; do sleep 2; done
      slurm_down "$dir"; rm -rf "$dir" ) >/dev/null 2>&1 </dev/null & )
  # Ready once the node is idle in the partition (the controller has heard from slurmd).
  for i in $(seq 150); do
    [[ "$(sinfo -h -N -o %t 2>/dev/null)" == idle ]] && return 0
    sleep 0.2
  done
  echo "Slurm did not come up in 30 s:"
  tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" 2>/dev/null
  return 1
}

slurm_down() {
  local dir=$1 i daemon pid
  if [[ -f "$dir/slurm.conf" ]]; then
    SLURM_CONF="$dir/slurm.conf" scancel --full --quiet --user=root 2>/dev/null
    for i in $(seq 50); do
      [[ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
  for daemon in slurmd slurmctld munged; do
    if [[ -f "$dir/$daemon.daemon" ]]; then
      pid=$(cat "$dir/$daemon.daemon")
      kill "$pid" 2>/dev/null || true  # (|| true: a caller under set -e must reach every daemon)
      for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      rm -f "$dir/$daemon.daemon"
    fi
  done
}
