#include "parallax/offload/intra_op_pool.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>

#include "parallax/core/error.h"

// libgomp's entry points (GOMP_4.0 ABI, what GCC compiles `#pragma omp parallel` to) and
// the OpenMP API calls the chunks need; LibTorch links the same libgomp.
extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
int omp_get_thread_num();
int omp_get_num_threads();
}

namespace parallax::offload {
namespace {

struct Region {
  Region(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) : n(n), fn(fn) {}
  const std::int64_t n;
  const std::function<void(std::int64_t, std::int64_t)>& fn;
  std::atomic<bool> failed{false};
  std::exception_ptr error;
};

// Runs on every thread of the team: its chunk of [0, n), sized by the team libgomp gave.
void run_chunk(void* data) {
  auto& region = *static_cast<Region*>(data);
  const std::int64_t threads = omp_get_num_threads();
  const std::int64_t chunk = (region.n + threads - 1) / threads;
  const std::int64_t begin = omp_get_thread_num() * chunk;
  if (begin >= region.n) return;
  try {
    region.fn(begin, std::min(region.n, begin + chunk));
  } catch (...) {
    // An exception must not leave an OpenMP region; the first is kept for the caller.
    if (!region.failed.exchange(true)) region.error = std::current_exception();
  }
}

}  // namespace

void intra_op_parallel_for(std::int64_t n,
                           std::int64_t grain,
                           const std::function<void(std::int64_t, std::int64_t)>& fn) {
  PARALLAX_CHECK(grain >= 1, UsageError, "intra_op_parallel_for: grain must be >= 1, got ", grain);
  if (n <= 0) return;
  at::internal::lazy_init_num_threads();  // this thread's pool size, as at::parallel_for sets it
  const std::int64_t threads = std::min<std::int64_t>(at::get_num_threads(), (n + grain - 1) / grain);
  if (threads <= 1 || at::in_parallel_region()) {
    fn(0, n);
    return;
  }
  Region region(n, fn);
  GOMP_parallel(&run_chunk, &region, static_cast<unsigned>(threads), 0);
  if (region.error) std::rethrow_exception(region.error);
}

int intra_op_thread_index() {
  return omp_get_thread_num();
}

}  // namespace parallax::offload
