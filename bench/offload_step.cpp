// bench_offload_step: one offloaded optimizer step (offload/offloaded_adam.h) with the
// state in host memory and with the NVMe tier, against the same file I/O alone, all
// measured in the same run, one process.
//
// The tier's step streams the moments (and with --masters the masters) through host
// buffers: it reads and writes the whole file once per step while the CPU Adam updates
// tile by tile. Without overlap it would take (in-memory step + file I/O); with perfect
// overlap max(in-memory step, file I/O). Printed: each time, and the tier's step as a
// ratio to both. The I/O baseline is the same file written and read back in buffer-sized
// sequential pwrite/pread calls on one thread, as the tier issues them. Where the
// directory is on a page-cached filesystem the "I/O" is mostly memory copies.
//
//   build/bench/bench_offload_step [--params 50] [--dir /tmp] [--buffer-mb 64]
//       [--buffer-counts 2,4] [--steps 5] [--masters]        (params in millions)
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "parallax/offload/offloaded_adam.h"
#include "parallax/offload/swap_file.h"

namespace {

using Clock = std::chrono::steady_clock;
using parallax::offload::OffloadedAdam;
using parallax::offload::OffloadedAdamOptions;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Options {
  std::int64_t params = 50'000'000;
  std::string dir = "/tmp";
  double buffer_mb = 64;
  std::vector<std::int64_t> buffer_counts{2, 4};
  int steps = 5;
  bool masters = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    if (arg == "--params") {
      o.params = static_cast<std::int64_t>(std::atof(value) * 1e6), ++i;
    } else if (arg == "--dir") {
      o.dir = value, ++i;
    } else if (arg == "--buffer-mb") {
      o.buffer_mb = std::atof(value), ++i;
    } else if (arg == "--buffer-counts") {
      o.buffer_counts.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) o.buffer_counts.push_back(std::atoll(item.c_str()));
      ++i;
    } else if (arg == "--steps") {
      o.steps = std::atoi(value), ++i;
    } else if (arg == "--masters") {
      o.masters = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_offload_step [--params M] [--dir D] [--buffer-mb MB] [--buffer-counts 2,4] "
                   "[--steps N] [--masters]\n");
      std::exit(2);
    }
  }
  return o;
}

// Median seconds of `steps` optimizer steps (after one warm-up step).
double time_steps(OffloadedAdam& adam, int steps) {
  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {
    const auto start = Clock::now();
    adam.step();
    if (s > 0) times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The file written, then read back, in buffer-sized sequential calls: median seconds.
double io_baseline(const Options& o, std::int64_t bytes, std::int64_t chunk) {
  parallax::offload::SwapFile file(o.dir, bytes, "bench");
  std::vector<char> buffer(static_cast<std::size_t>(chunk), 1);
  std::vector<double> times;
  for (int s = 0; s <= o.steps; ++s) {
    const auto start = Clock::now();
    for (std::int64_t offset = 0; offset < bytes; offset += chunk) {
      file.write(offset, buffer.data(), std::min(chunk, bytes - offset));
    }
    for (std::int64_t offset = 0; offset < bytes; offset += chunk) {
      file.read(offset, buffer.data(), std::min(chunk, bytes - offset));
    }
    if (s > 0) times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  torch::manual_seed(0);
  const std::vector<torch::Tensor> initial{torch::randn({o.params})};
  OffloadedAdamOptions base;
  base.adam = parallax::offload::CpuAdamOptions(1e-3).betas(0.9, 0.95).weight_decay(0.1).decoupled(true);
  base.owner = "bench";
  base.nvme_path = o.dir;
  base.buffer_bytes = static_cast<std::int64_t>(o.buffer_mb * 1024 * 1024);

  OffloadedAdam in_memory(base, initial);
  in_memory.gradient(0).normal_();
  const double memory_s = time_steps(in_memory, o.steps);

  const std::int64_t streams = o.masters ? 3 : 2;
  const std::int64_t file_bytes = streams * o.params * 4;
  const double io_s = io_baseline(o, file_bytes, base.buffer_bytes / streams);

  std::printf("Offloaded Adam step, %lld parameters, %d intra-op threads, file under %s (%s, %.0f MiB buffers)\n",
              static_cast<long long>(o.params), at::get_num_threads(), o.dir.c_str(),
              o.masters ? "moments and masters" : "moments", o.buffer_mb);
  std::printf("  in-memory step %.1f ms; file I/O baseline (write + read %.0f MiB, one thread) %.1f ms = %.2f GB/s\n",
              memory_s * 1e3, file_bytes / 1048576.0, io_s * 1e3, 2.0 * file_bytes / io_s / 1e9);
  std::printf("  %8s %12s %16s %18s\n", "buffers", "tier ms", "/ (mem + I/O)", "/ max(mem, I/O)");
  for (const std::int64_t count : o.buffer_counts) {
    OffloadedAdamOptions tiered = base;
    tiered.moments_on_nvme = true;
    tiered.masters_on_nvme = o.masters;
    tiered.buffer_count = count;
    OffloadedAdam adam(tiered, initial);
    adam.gradient(0).copy_(in_memory.gradient(0));
    const double tier_s = time_steps(adam, o.steps);
    std::printf("  %8lld %12.1f %16.2f %18.2f\n", static_cast<long long>(count), tier_s * 1e3,
                tier_s / (memory_s + io_s), tier_s / std::max(memory_s, io_s));
  }
  std::printf("(1.00 in the last column is perfect overlap of I/O and update; 1.00 in the one before, none)\n");
  return 0;
}
