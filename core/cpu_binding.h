// Which cores a rank's compute threads run on, and binding a thread to one (hwloc).
//
// On a node with several ranks, each rank takes an equal, contiguous share of the
// cores the process may run on (the launcher's binding if it set one, else the whole
// machine), optionally only those near its device; when the launcher gave every rank
// cores of its own (bound_apart), a rank takes all of its own; one PU per core, so two threads
// never share a core's hyperthreads. The offloaded optimizer binds LibTorch's intra-op
// threads to that share, so the memory-bound CPU Adam streams from the rank's own
// cores instead of migrating between them.
//
//   const std::vector<int> pus = rank_cpu_share(world.local_rank(), world.local_size());
//   bind_calling_thread(pus.front());
#pragma once

#include <string>
#include <vector>

namespace parallax {

/// Cores [first, first + count) of the `local_rank`-th of `local_size` equal, contiguous
/// shares of `cores` cores (indexes in core order; a remainder goes one core each to
/// the later shares); with more ranks than cores, core local_rank mod cores alone. Pure.
struct CoreShare {
  int first = 0;
  int count = 1;
};
CoreShare core_share(int local_rank, int local_size, int cores);

/// The PUs (OS indexes), one per core, of the `local_rank`-th of `local_size` equal
/// shares of the cores this process may run on; when `near` (an hwloc list such as a
/// GPU's cpuset, "0-15") overlaps them, of those cores only. With more ranks than
/// cores, core `local_rank` mod cores. Never empty. Throws TopologyError if hwloc
/// fails, UsageError for local_rank outside [0, local_size).
std::vector<int> rank_cpu_share(int local_rank, int local_size, const std::string& near = "");

/// rank_cpu_share's PUs, with what it saw on the way (one hwloc discovery).
struct RankCpus {
  std::vector<int> pus;        ///< as rank_cpu_share
  int usable_cores = 0;        ///< the cores this process may run on, shared by the local ranks
  bool process_bound = false;  ///< a launcher (mpirun --bind-to core, taskset) bound it to fewer PUs than the machine's
};
RankCpus rank_cpus(int local_rank, int local_size, const std::string& near = "");

/// The PUs the launcher bound this process to, hwloc list format ("4-7"), or "" when it
/// may run on every PU the machine allows it. Throws TopologyError if hwloc fails.
std::string process_binding();

/// True when the launcher gave each of a node's ranks PUs of its own: every one of
/// `bindings` (process_binding() of each rank on the node) is set and no two overlap.
/// srun's --cpu-bind (with --cpus-per-task) and mpirun's --map-by slot:PE=n --bind-to
/// core do so; a rank then uses its whole binding (rank_cpus(0, 1)) instead of a share
/// of it. False for a single rank, an unbound one, or an unreadable list. Pure.
bool bound_apart(const std::vector<std::string>& bindings);

/// Binds the calling thread to PU `os_index`. Throws TopologyError naming it.
void bind_calling_thread(int os_index);

/// Binds every thread of this process to the PUs `os_indexes` (threads started later
/// inherit it). Throws TopologyError naming them.
void bind_process(const std::vector<int>& os_indexes);

/// The PUs the calling thread may run on, hwloc list format ("2", "0-15").
std::string calling_thread_binding();

}  // namespace parallax
