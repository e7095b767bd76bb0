// One owner of each rank's CPU threads. At init every rank takes an equal share of its
// node's cores (core/cpu_binding.h) and decides, once, how many threads each pool gets,
// so that together they do not exceed that share:
//
//   BLAS runs on           intra-op (LibTorch)        BLAS
//   its own threads        1 (cores with CPU Adam)    cores (1 with CPU Adam)
//   the OpenMP pool        cores                      not set (the intra-op threads)
//   sequential / unknown   cores                      not set
//
// Two pools that each busy-wait for work on the same cores (Debian's OpenBLAS spins
// with sched_yield, libgomp spins before sleeping) take turns burning them: measured on
// 2 cores, a GPT step of 675 ms with both at 2 threads against 394 ms with the intra-op
// pool at 1 (bench/threads.sh). Most of a step's compute is BLAS; the elementwise
// operators that the intra-op pool would split are a small part. The offloaded CPU Adam
// runs on the intra-op threads, so with it those get the cores instead (on a GPU build
// BLAS is idle on the host anyway).
//
// When the ranks do not outnumber the node's cores and the launcher left the process
// unbound (mpirun --bind-to none), each rank's process is bound to its share (threads
// started later, BLAS's and OpenMP's, inherit it); a launcher's binding is kept.
// [threads] intra_op, blas and bind override the choices; environment variables
// (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS) no longer decide, as they could not see the
// other ranks.
#pragma once

#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/core/cpu_binding.h"
#include "parallax/runtime/blas_info.h"

namespace parallax {

struct ThreadBudget {
  std::vector<int> pus;  ///< this rank's cores (one PU each, OS indexes)
  bool bind = false;     ///< bind the process to `pus`
  std::string binding;   ///< what happened to the binding, in a few words
  int intra_op = 1;      ///< LibTorch's intra-op threads
  int blas = 0;          ///< the BLAS's threads; 0 = left as it is (no API, or the OpenMP pool's)
  std::string reason;    ///< why, in a few words
};

/// The table above, for a rank owning `cpus` (core/cpu_binding.h's rank_cpus; its core is
/// shared when the node's `local_size` ranks outnumber the usable cores) with a BLAS
/// that runs on `blas`, an offloaded CPU optimizer or not; `options` override. Pure.
ThreadBudget budget_threads(
    RankCpus cpus, int local_size, BlasThreading blas, bool cpu_optimizer, const ThreadOptions& options);

/// Binds the process (when budget.bind) and sizes the pools. Throws TopologyError when
/// binding fails.
void apply_thread_budget(const ThreadBudget& budget);

/// "2 core(s) {0,1}, bound: intra-op 1, BLAS 2 (BLAS on its own threads; ...)".
std::string describe_thread_budget(const ThreadBudget& budget, BlasThreading blas);

}  // namespace parallax
