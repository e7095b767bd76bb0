// Shared by the benches run under mpirun: how an iteration is timed.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "parallax/core/communicator.h"

namespace bench {

/// Seconds of the slowest rank (what a training step waits for), median over `iters`
/// iterations after one warm-up; each iteration starts at a barrier over `world`.
inline double slowest_rank_median_seconds(parallax::Communicator& world,
                                          int iters,
                                          const std::function<void()>& body) {
  body();  // warm-up
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    world.barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    body();
    torch::Tensor elapsed =
        torch::full({1}, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                    torch::kDouble);
    parallax::CollectiveOptions max;
    max.reduce_op = parallax::ReduceOp::kMax;
    world.all_reduce(elapsed, max)->wait();
    times.push_back(elapsed.item<double>());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace bench
