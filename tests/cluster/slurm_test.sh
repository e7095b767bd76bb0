#!/usr/bin/env bash
# Parallax under a real Slurm (tests/cluster/slurm.sh: slurmctld, slurmd and munged started
# here, stopped on exit whatever happens):
#  1. srun -n 8 --mpi=pmix train_gpt with configs/3d.toml trains exactly as mpirun -np 8
#     does (the same loss at every logged step);
#  2. examples/slurm/train_gpt.sbatch, submitted with sbatch (waited for), trains the same way;
#  3. tasks that srun bound to cores of their own keep to them ("as the launcher bound it");
#  4. a task that srun started but MPI left alone (SLURM_STEP_ID and SLURM_NTASKS=4 in a
#     world of one: srun and MPI without a shared PMI) is refused, naming srun --mpi=pmix;
#  5. on two genuine hosts (two_nodes.sh: node0 and node1, a slurmd on each), srun -N 2 -n 8
#     and the batch script as written (2 nodes, 8 tasks) place ranks 0-3 on node0 and 4-7
#     on node1 and train as mpirun does (skipped where namespaces cannot be made).
# Exits 77 (skipped) where Slurm cannot run here, saying why.
# Usage: slurm_test.sh <mpiexec> <train_gpt> <configs-dir> <repository>
set -u
mpiexec=$1 train=$2 configs=$3 repository=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/slurm.sh"
source "$here/two_nodes.sh"
if ! why=$(slurm_available); then echo "SKIP: $why"; exit 77; fi
work=$(mktemp -d)
mkdir "$work/one" "$work/two" "$work/hosts"
trap 'slurm_down "$work/two"; slurm_down "$work/one"; two_nodes_down "$work/hosts"; rm -rf "$work"' EXIT
slurm_up "$work/one" || { echo "FAIL Slurm did not start"; exit 1; }
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
export OMP_NUM_THREADS=1
steps=(--set train.steps=4 --set logging.every=1)
losses() { grep -oE "^step [0-9]+/[0-9]+ \| loss [0-9.]+" "$1"; }

as_root=()
[[ "$(id -u)" -eq 0 ]] && as_root=(--allow-run-as-root)
timeout 300 "$mpiexec" "${as_root[@]}" --oversubscribe --bind-to none -np 8 -x OMP_NUM_THREADS \
  "$train" --config "$configs/3d.toml" "${steps[@]}" >"$work/mpirun.log" 2>&1 ||
  { fail "the mpirun reference run failed"; tail -5 "$work/mpirun.log"; }
[[ "$(losses "$work/mpirun.log" | wc -l)" -eq 4 ]] || fail "the mpirun run logged no 4 steps"

# 1. srun starts the ranks itself.
if slurm_run "$work/one" srun --time=5 --overcommit -n 8 --mpi=pmix "$train" --config "$configs/3d.toml" "${steps[@]}" \
     >"$work/srun.log" 2>&1; then
  if diff <(losses "$work/mpirun.log") <(losses "$work/srun.log") >/dev/null &&
     grep -q "tp=2, pp=2, dp=2" "$work/srun.log"; then
    echo "ok   srun -n 8 --mpi=pmix: the same losses as mpirun ($(losses "$work/srun.log" | tail -1))"
  else
    fail "srun's run differs from mpirun's"; diff <(losses "$work/mpirun.log") <(losses "$work/srun.log")
  fi
else
  fail "srun -n 8 --mpi=pmix failed"; tail -10 "$work/srun.log"
fi

# 2. The batch script users submit.
if (cd "$repository" && PARALLAX_TRAIN=$train PARALLAX_CONFIG=$configs/3d.toml \
      slurm_batch "$work/one" --time=5 --nodes=1 --overcommit --output="$work/sbatch.log" \
      examples/slurm/train_gpt.sbatch "${steps[@]}"); then
  if diff <(losses "$work/mpirun.log") <(losses "$work/sbatch.log") >/dev/null; then
    echo "ok   sbatch examples/slurm/train_gpt.sbatch: the same losses as mpirun"
  else
    fail "the sbatch job's run differs from mpirun's"; diff <(losses "$work/mpirun.log") <(losses "$work/sbatch.log")
  fi
else
  fail "the sbatch job failed"; tail -10 "$work/sbatch.log"
fi

# 3. Cores Slurm gave each task.
cores=$(getconf _NPROCESSORS_ONLN)
if slurm_run "$work/one" srun --time=5 -n "$cores" --cpus-per-task=1 --cpu-bind=cores --mpi=pmix "$train" \
     --config "$configs/dp.toml" --set train.steps=1 >"$work/bound.log" 2>&1; then
  if grep -q "^# threads (rank 0): 1 core(s) {[0-9]*}, as the launcher bound it" "$work/bound.log"; then
    echo "ok   srun --cpu-bind=cores: each rank keeps to the core Slurm gave it"
  else
    fail "the ranks did not keep to Slurm's binding"; grep "^# threads" "$work/bound.log"
  fi
else
  fail "srun --cpu-bind=cores failed"; tail -10 "$work/bound.log"
fi

# 4. A world that is not the job srun started.
if SLURM_STEP_ID=0 SLURM_NTASKS=4 SLURM_PROCID=2 timeout 120 "$train" --config "$configs/dp.toml" \
     --set train.steps=1 >"$work/singleton.log" 2>&1; then
  fail "a world of one under srun's 4 tasks trained"
elif grep -q "SLURM_NTASKS=4.*srun --mpi=pmix" "$work/singleton.log"; then
  echo "ok   a task srun started alone is refused: $(grep -o "the launcher started.*of them" "$work/singleton.log" | head -1)"
else
  fail "the singleton's error does not name SLURM_NTASKS and the fix"; tail -5 "$work/singleton.log"
fi

# 5. Two hosts, a slurmd on each.
slurm_down "$work/one"
if ! why=$(two_nodes_available); then
  echo "skip two hosts: $why"
elif ! two_nodes_up "$work/hosts" || ! slurm_up "$work/two" "$work/hosts"; then
  fail "Slurm on two hosts did not start"
else
  placed() { grep -q "^  node0: .*ranks {0,1,2,3}" "$1" && grep -q "^  node1: .*ranks {4,5,6,7}" "$1"; }
  if slurm_run "$work/two" srun --time=5 -N 2 -n 8 --overcommit --mpi=pmix "$train" --config "$configs/3d.toml" \
       "${steps[@]}" >"$work/srun2.log" 2>&1 && placed "$work/srun2.log" &&
     diff <(losses "$work/mpirun.log") <(losses "$work/srun2.log") >/dev/null; then
    echo "ok   srun -N 2 -n 8 on node0 and node1: ranks 0-3 on node0, 4-7 on node1, the same losses as mpirun"
  else
    fail "srun over two hosts"; grep -E "node[01]: |Error|error" "$work/srun2.log" | head -5
  fi
  if (cd "$repository" && PARALLAX_TRAIN=$train PARALLAX_CONFIG=$configs/3d.toml \
        slurm_batch "$work/two" --time=5 --overcommit --output="$work/sbatch2.log" \
        examples/slurm/train_gpt.sbatch "${steps[@]}") && placed "$work/sbatch2.log" &&
     diff <(losses "$work/mpirun.log") <(losses "$work/sbatch2.log") >/dev/null; then
    echo "ok   sbatch examples/slurm/train_gpt.sbatch as written (2 nodes, 8 tasks): placed and trained as mpirun"
  else
    fail "the batch script over two hosts"; grep -E "node[01]: |Error|error" "$work/sbatch2.log" | head -5
  fi
fi

if [[ "$failures" -ne 0 ]]; then echo "$failures Slurm case(s) failed"; exit 1; fi
echo "Slurm: srun and sbatch train as mpirun does, binding kept, a mismatched world refused"
