#!/usr/bin/env bash
# rank_of_pid PID: the world rank of a running Parallax process, read from the variable its
# launcher gave it, in runtime/program_flags.cpp's order: OMPI_COMM_WORLD_RANK (mpirun),
# PMIX_RANK (srun --mpi=pmix), PMI_RANK (Hydra), SLURM_PROCID (any srun task). Prints
# nothing, with status 1, for a process that is gone or carries none of them. Source it.
rank_of_pid() {
  local environment variable value
  environment=$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null) || return 1
  for variable in OMPI_COMM_WORLD_RANK PMIX_RANK PMI_RANK SLURM_PROCID; do
    value=$(sed -n "s/^$variable=//p" <<<"$environment")
    if [[ -n "$value" ]]; then echo "$value"; return 0; fi
  done
  return 1
}
