// bench_cpu_adam: the fused CPU Adam (offload/cpu_adam.h) against torch::optim::Adam and
// against this machine's memory bandwidth, all measured in the same run, one process.
//
// For 10M, 50M and 200M fp32 parameters: parameters updated per second by each, their
// ratio, and ours in bytes per second (28 bytes per parameter per step: read parameter,
// gradient and two moments, write parameter and two moments) as a fraction of a
// STREAM-triad-style bandwidth measured over the same threads (a = b + s·c; 16 bytes
// per element including the write-allocate read of a; our 28 bytes have no such extra
// read, since every array written was just read).
//
// The floor that matters most is Adam's own access pattern with trivial arithmetic
// (read four arrays, write three: 28 bytes per element), measured the same way.
//
//   build/bench/bench_cpu_adam [--sizes 10,50,200] [--steps 5] [--threads N]   (sizes in millions)
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "parallax/offload/cpu_adam.h"
#include "parallax/offload/intra_op_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Best of `repeats` triads over n floats: bytes per second, counting the write-allocate
// read of `a` (16 bytes per element: what the memory system really moves).
double triad_bandwidth(std::int64_t n, int repeats) {
  std::vector<float> a_store(n, 0.0f), b_store(n, 1.0f), c_store(n, 2.0f);
  float* __restrict a = a_store.data();
  const float* __restrict b = b_store.data();
  const float* __restrict c = c_store.data();
  const float s = 3.0f;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    parallax::offload::intra_op_parallel_for(n, 1 << 16, [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
    });
    best = std::min(best, seconds_since(start));
  }
  if (a[n / 2] != 7.0f) std::fprintf(stderr, "triad check failed\n");
  return 16.0 * static_cast<double>(n) / best;
}

// The floor for Adam's own access pattern: read four arrays, write three, with trivial
// arithmetic (28 bytes per element), best of `repeats`; bytes per second.
double update_floor_bandwidth(std::int64_t n, int repeats) {
  std::vector<float> p_store(n, 1.0f), g_store(n, 1e-3f), m_store(n, 0.0f), v_store(n, 0.0f);
  float* __restrict p = p_store.data();
  const float* __restrict g = g_store.data();
  float* __restrict m = m_store.data();
  float* __restrict v = v_store.data();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    parallax::offload::intra_op_parallel_for(n, 1 << 16, [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        m[i] += g[i];
        v[i] += g[i];
        p[i] -= g[i];
      }
    });
    best = std::min(best, seconds_since(start));
  }
  return 28.0 * static_cast<double>(n) / best;
}

// Median seconds per step of `step_fn` over `steps` steps after one warm-up.
template <typename F>
double median_step_seconds(int steps, F&& step_fn) {
  step_fn(1);
  std::vector<double> times;
  for (int s = 2; s < steps + 2; ++s) {
    const auto start = Clock::now();
    step_fn(s);
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<std::int64_t> parse_sizes(const std::string& text) {
  std::vector<std::int64_t> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) sizes.push_back(std::stoll(item) * 1000000);
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> sizes{10000000, 50000000, 200000000};
  int steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sizes") {
      sizes = parse_sizes(argv[i + 1]);
    } else if (flag == "--threads") {
      at::set_num_threads(std::max(1, std::atoi(argv[i + 1])));
    } else if (flag == "--steps") {
      steps = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: %s [--sizes 10,50,200] [--steps 5] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  const double bandwidth = triad_bandwidth(50000000, 5);
  const double floor = update_floor_bandwidth(50000000, 5);
  std::printf("CPU Adam, %d threads, %s kernel; triad %.1f GB/s; Adam-pattern floor (read 4, write 3) %.1f GB/s\n",
              at::get_num_threads(), parallax::offload::CpuAdam::instruction_set(), bandwidth / 1e9, floor / 1e9);
  std::printf("%12s %16s %16s %8s %12s %10s %10s\n", "parameters", "torch params/s", "ours params/s", "ratio",
              "ours GB/s", "of triad", "of floor");
  for (const std::int64_t n : sizes) {
    torch::NoGradGuard no_grad;
    double torch_seconds = 0, ours_seconds = 0;
    {
      torch::Tensor p = torch::randn({n}), g = torch::randn({n}) * 0.01;
      p.mutable_grad() = g;
      torch::optim::Adam adam(std::vector<torch::Tensor>{p}, torch::optim::AdamOptions(1e-3));
      torch_seconds = median_step_seconds(steps, [&](int) { adam.step(); });
    }
    {
      torch::Tensor p = torch::randn({n}), g = torch::randn({n}) * 0.01, m = torch::zeros({n}), v = torch::zeros({n});
      const parallax::offload::CpuAdam adam(parallax::offload::CpuAdamOptions(1e-3));
      ours_seconds = median_step_seconds(steps, [&](int step) {
        adam.step(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, step);
      });
    }
    const double ours_bytes = 28.0 * static_cast<double>(n) / ours_seconds;
    std::printf("%12lld %16.3g %16.3g %8.2f %12.1f %9.0f%% %9.0f%%\n", static_cast<long long>(n), n / torch_seconds,
                n / ours_seconds, torch_seconds / ours_seconds, ours_bytes / 1e9, 100.0 * ours_bytes / bandwidth,
                100.0 * ours_bytes / floor);
  }
  return 0;
}
