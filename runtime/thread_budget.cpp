#include "parallax/runtime/thread_budget.h"

#include <ATen/Parallel.h>

#include <sstream>

#include "parallax/core/cpu_binding.h"

namespace parallax {

ThreadBudget budget_threads(
    RankCpus cpus, int local_size, BlasThreading blas, bool cpu_optimizer, const ThreadOptions& options) {
  ThreadBudget budget;
  const int cores = std::max<int>(1, static_cast<int>(cpus.pus.size()));
  const bool shared = local_size > cpus.usable_cores;
  budget.pus = std::move(cpus.pus);
  budget.bind = options.bind && !shared && !cpus.process_bound;
  if (budget.bind) {
    budget.binding = "bound";
  } else if (cpus.process_bound) {
    budget.binding = "as the launcher bound it";
  } else if (shared) {
    budget.binding = "shared with other ranks, not bound";
  } else {
    budget.binding = "not bound ([threads] bind = false)";
  }
  switch (blas) {
    case BlasThreading::kOwnThreads:
      if (cpu_optimizer) {
        budget.intra_op = cores;
        budget.blas = 1;
        budget.reason = "the offloaded CPU Adam runs on the intra-op threads; BLAS keeps one";
      } else {
        budget.intra_op = 1;
        budget.blas = cores;
        budget.reason = "BLAS spins in threads of its own: the cores go to it, not to two pools taking turns";
      }
      break;
    case BlasThreading::kOpenMp:
      budget.intra_op = cores;
      budget.reason = "BLAS shares LibTorch's OpenMP pool";
      break;
    case BlasThreading::kSequential:
    case BlasThreading::kUnknown:
      budget.intra_op = cores;
      budget.reason = "BLAS has no thread pool to size";
      break;
  }
  if (options.intra_op > 0) budget.intra_op = options.intra_op;
  if (options.blas > 0) budget.blas = options.blas;
  if (options.intra_op > 0 || options.blas > 0) budget.reason = "as [threads] sets";
  return budget;
}

void apply_thread_budget(const ThreadBudget& budget) {
  if (budget.bind) bind_process(budget.pus);
  at::set_num_threads(budget.intra_op);
  if (budget.blas > 0) set_blas_threads(budget.blas);
}

std::string describe_thread_budget(const ThreadBudget& budget, BlasThreading blas) {
  std::ostringstream out;
  out << budget.pus.size() << " core(s) {";
  for (std::size_t i = 0; i < budget.pus.size(); ++i) out << (i ? "," : "") << budget.pus[i];
  out << "}, " << budget.binding << ": intra-op " << budget.intra_op << ", BLAS ";
  if (budget.blas > 0) {
    out << budget.blas;
  } else {
    out << "unchanged";
  }
  out << " (BLAS on " << to_string(blas) << "; " << budget.reason << ")";
  return out.str();
}

}  // namespace parallax
