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

// ThreadSanitizer builds (scripts/sanitize.sh tsan): the team's fork and join happen
// inside libgomp, which is not instrumented, so they are announced to TSan by hand (the
// caller's setup before the chunks, the chunks' writes before the caller's reads).
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PARALLAX_TSAN_ANNOTATIONS 1
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif
#endif

namespace parallax::offload {
namespace {

void happens_before(void* sync) {
#ifdef PARALLAX_TSAN_ANNOTATIONS
  __tsan_release(sync);
#else
  (void)sync;
#endif
}

void happens_after(void* sync) {
#ifdef PARALLAX_TSAN_ANNOTATIONS
  __tsan_acquire(sync);
#else
  (void)sync;
#endif
}

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
  happens_after(&region);
  struct Joined {
    Region* region;
    ~Joined() { happens_before(region); }
  } joined{&region};
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
  happens_before(&region);
  GOMP_parallel(&run_chunk, &region, static_cast<unsigned>(threads), 0);
  happens_after(&region);
  if (region.error) std::rethrow_exception(region.error);
}

int intra_op_thread_index() {
  return omp_get_thread_num();
}

}  // namespace parallax::offload
