// LibTorch's intra-op thread pool, entered without the compiler's OpenMP support.
//
// LibTorch (Debian's and the PyPI wheel) runs its intra-op work on libgomp's OpenMP
// pool. at::parallel_for reaches that pool only from code compiled with GCC's -fopenmp:
// it is a header template whose `#pragma omp parallel` is compiled into the caller, so
// without OpenMP it runs on one thread, and Clang's OpenMP calls LLVM's runtime instead,
// which would put a second pool in the process. intra_op_parallel_for enters libgomp's
// pool through libgomp's own entry point (the one GCC's pragma compiles to), so the CPU
// Adam runs on LibTorch's threads, sized by at::set_num_threads, whichever compiler
// built Parallax.
//
//   intra_op_parallel_for(numel, 1 << 16, [&](std::int64_t begin, std::int64_t end) {
//     for (std::int64_t i = begin; i < end; ++i) p[i] -= lr * g[i];
//   });
#pragma once

#include <cstdint>
#include <functional>

namespace parallax::offload {

/// Splits [0, n) into one contiguous chunk per thread of the intra-op pool
/// (at::get_num_threads() threads, but no more than ceil(n / grain)) and runs
/// fn(begin, end) for each chunk on the pool's threads, the caller's among them; returns
/// when every chunk is done. Runs fn(0, n) inline when one thread suffices or when called
/// from inside a parallel region. The first exception fn throws is rethrown here, after
/// every chunk has ended.
void intra_op_parallel_for(std::int64_t n,
                           std::int64_t grain,
                           const std::function<void(std::int64_t begin, std::int64_t end)>& fn);

/// Inside intra_op_parallel_for's fn: this thread's index in the pool (0 for the caller,
/// which runs the first chunk).
int intra_op_thread_index();

}  // namespace parallax::offload
