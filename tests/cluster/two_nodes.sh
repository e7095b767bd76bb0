#!/usr/bin/env bash
# Two genuine hosts on this machine, for tests: two Linux UTS + network + mount namespaces
# named node0 and node1, joined by a veth pair (10.77.N.1 and .2/24, N from the caller's
# pid), each with its own host name, network stack and mounts, so Open MPI's ranks on
# different nodes talk over TCP and never through shared memory, and a file can differ
# between the nodes. Source it, then:
#
#   two_nodes_for_test            a test's prologue: skip (77) or make them in $work
#   two_nodes_up DIR              create them (DIR: an empty directory of the caller's)
#   two_nodes_mpirun DIR ARGS     mpirun, run inside node0, ranks on node0 and node1
#   two_nodes_exec DIR HOST CMD   run CMD in HOST's namespaces (a mount only it sees)
#   two_nodes_env DIR HOST VAR=V  give HOST's ranks an environment variable of their own
#   two_nodes_down DIR            remove everything (also call it from an EXIT trap)
#
# Traffic goes only between the two namespaces: neither has a route beyond their link,
# and mpirun runs inside node0 (the root namespace's default route leaves this machine,
# so nothing there may address the test's link). Killing the namespaces' holder
# processes removes the namespaces, their mounts and the veth pair with them. Needs root (or
# CAP_SYS_ADMIN and CAP_NET_ADMIN); two_nodes_available says whether this machine allows it.

# two_nodes_available: exit status 0 when namespaces and veth pairs can be made here,
# else 1 with the reason on stdout.
two_nodes_available() {
  local probe
  command -v unshare >/dev/null && command -v nsenter >/dev/null && command -v ip >/dev/null ||
    { echo "unshare, nsenter or ip (iproute2) is missing"; return 1; }
  probe=$(unshare --uts --net --mount sh -c 'hostname probe && ip link add pxprobe0 type veth peer name pxprobe1' 2>&1) ||
    { echo "cannot create UTS, network and mount namespaces with a veth pair here: $probe"; return 1; }
  return 0
}

# two_nodes_for_test: a test's prologue. Exits 77 (skipped, saying why) where the machine
# cannot make namespaces; else sets `work` to a new directory, makes the hosts in it and
# removes both on exit (an EXIT trap), or exits 1 when they cannot be made.
two_nodes_for_test() {
  local why
  if ! why=$(two_nodes_available); then echo "SKIP: $why"; exit 77; fi
  work=$(mktemp -d)
  trap 'two_nodes_down "$work"; rm -rf "$work"' EXIT
  two_nodes_up "$work" || { echo "FAIL could not make the two hosts"; exit 1; }
}

two_nodes_up() {
  local dir=$1 n=$(( $$ % 250 + 1 )) i pid
  echo "$n" >"$dir/subnet"
  for i in 0 1; do
    unshare --uts --net --mount --propagation private sleep 3600 </dev/null >/dev/null 2>&1 &  # ends by itself should no trap run
    echo $! >"$dir/node$i.pid"
  done
  sleep 0.2
  local p0 p1
  p0=$(cat "$dir/node0.pid") p1=$(cat "$dir/node1.pid")
  nsenter -t "$p0" -u hostname node0 && nsenter -t "$p1" -u hostname node1 || return 1
  ip link add "pxa$n" type veth peer name "pxb$n" || return 1
  ip link set "pxa$n" netns "$p0" && ip link set "pxb$n" netns "$p1" || return 1
  nsenter -t "$p0" -n ip addr add "10.77.$n.1/24" dev "pxa$n" || return 1
  nsenter -t "$p1" -n ip addr add "10.77.$n.2/24" dev "pxb$n" || return 1
  for pid in "$p0" "$p1"; do nsenter -t "$pid" -n ip link set lo up || return 1; done
  nsenter -t "$p0" -n ip link set "pxa$n" up && nsenter -t "$p1" -n ip link set "pxb$n" up || return 1
  # The launch agent Open MPI calls as it would ssh: "agent HOST COMMAND...". The command
  # is re-parsed by a shell, since orted's arguments carry quoted values with ';'. HOST's
  # own variables (two_nodes_env) go to orted and so to its ranks.
  touch "$dir/node0.env" "$dir/node1.env"
  cat >"$dir/agent.sh" <<AGENT
#!/bin/sh
host=\$1; shift
exec nsenter -t "\$(cat "$dir/\$host.pid")" -u -n -m -- /bin/sh -c ". '$dir/\$host.env'; \$*"
AGENT
  chmod +x "$dir/agent.sh"
}

# two_nodes_mpirun DIR [mpirun arguments]: -np and --host (or --map-by) as usual, with
# node0 and node1 as the host names.
two_nodes_mpirun() {
  local dir=$1; shift
  local n
  n=$(cat "$dir/subnet")
  nsenter -t "$(cat "$dir/node0.pid")" -u -n -m --wd="$PWD" -- mpirun --allow-run-as-root \
    --mca plm_rsh_agent "$dir/agent.sh" --mca oob_tcp_if_include "10.77.$n.0/24" \
    --mca btl_tcp_if_include "10.77.$n.0/24" "$@"
}

two_nodes_exec() {
  local dir=$1 host=$2; shift 2
  nsenter -t "$(cat "$dir/$host.pid")" -u -n -m -- "$@"
}

two_nodes_env() {
  local dir=$1 host=$2 setting value; shift 2
  for setting in "$@"; do
    value=${setting#*=}
    value=${value//\'/\'\\\'\'}  # ' becomes '\'' inside the single quotes
    printf "export %s='%s'\n" "${setting%%=*}" "$value" >>"$dir/$host.env"
  done
}

two_nodes_down() {
  local dir=$1 i pid
  for i in 0 1; do
    if [ -f "$dir/node$i.pid" ]; then
      pid=$(cat "$dir/node$i.pid")
      kill "$pid" 2>/dev/null || true  # (|| true: a caller under set -e must reach node1 too)
      wait "$pid" 2>/dev/null || true
      rm -f "$dir/node$i.pid"
    fi
  done
}
