// bench_allreduce: the MPI communicator's bucketed all-reduce against raw MPI_Allreduce,
// same buffer, same ranks, same run.
//
// For each size (fp32, 4 KiB .. 64 MiB by default) the buffer is cut into buckets of
// --bucket-mb, every bucket's all_reduce is launched and then all are waited, as the
// data-parallel engine does with gradient buckets. Each iteration starts at a barrier;
// its time is the slowest rank's; the two contenders alternate iteration by iteration.
// The table reports the median over --iters iterations after --warmup ones, as bus
// bandwidth: busbw = 2(n-1)/n × bytes / time (the
// nccl-tests convention, comparable across rank counts).
//
//   mpirun -np 4 ./bench/bench_allreduce [--bucket-mb 25] [--iters N] [--warmup 2]
//                                        [--min-kb 4] [--max-mb 64] [--nonblocking]
#include <ATen/ATen.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/world.h"

namespace {

struct Options {
  double bucket_mb = 25;     ///< bucket size in MiB, as `[zero] bucket_mb`
  int iters = 0;             ///< timed iterations per size; 0 = by size (20 ≤ 1 MiB, fewer above)
  int warmup = 2;            ///< untimed iterations per size
  std::int64_t min_kb = 4;   ///< smallest buffer, KiB
  std::int64_t max_mb = 64;  ///< largest buffer, MiB
  /// Also time the same buckets with MPI_Iallreduce + MPI_Waitall on the calling thread:
  /// the algorithm Parallax uses, without its queue and progress thread. Diagnostic.
  bool nonblocking = false;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--bucket-mb" && has_value) {
      options.bucket_mb = std::atof(argv[++i]);
    } else if (flag == "--iters" && has_value) {
      options.iters = std::atoi(argv[++i]);
    } else if (flag == "--warmup" && has_value) {
      options.warmup = std::atoi(argv[++i]);
    } else if (flag == "--min-kb" && has_value) {
      options.min_kb = std::atoll(argv[++i]);
    } else if (flag == "--max-mb" && has_value) {
      options.max_mb = std::atoll(argv[++i]);
    } else if (flag == "--nonblocking") {
      options.nonblocking = true;
    } else {
      throw parallax::UsageError("bench_allreduce: unknown or incomplete argument '" + flag +
                                 "'; flags: --bucket-mb MB --iters N --warmup N --min-kb KB "
                                 "--max-mb MB --nonblocking");
    }
  }
  PARALLAX_CHECK(options.bucket_mb > 0 && options.iters >= 0 && options.warmup >= 0 && options.min_kb > 0 &&
                     options.max_mb * 1024 >= options.min_kb,
                 UsageError, "bench_allreduce: invalid flags");
  return options;
}

// Iterations for a buffer of `bytes`: fewer for big buffers, so the default run stays
// short on a loaded 2-core machine.
int iterations_for(const Options& options, std::int64_t bytes) {
  if (options.iters > 0) return options.iters;
  if (bytes <= (1 << 20)) return 20;
  return static_cast<int>(std::max<std::int64_t>(5, 20 * (1 << 20) / bytes));
}

// One timed run of `body`: starts at a barrier; the slowest rank's time, in seconds.
double timed(const std::function<void()>& body) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  body();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string human(std::int64_t bytes) {
  char text[32];
  if (bytes >= (1 << 20)) {
    std::snprintf(text, sizeof(text), "%lld MiB", static_cast<long long>(bytes >> 20));
  } else {
    std::snprintf(text, sizeof(text), "%lld KiB", static_cast<long long>(bytes >> 10));
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  parallax::World world(argc, argv);
  try {
    const Options options = parse(argc, argv);
    parallax::Communicator& comm = world.communicator();
    const int n = world.size();
    const bool lead = world.rank() == 0;
    const std::int64_t bucket_elements =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(options.bucket_mb * (1 << 20)) / 4);
    if (lead) {
      std::printf("all_reduce fp32 on %d ranks, buckets of %g MiB, median of the slowest rank\n", n, options.bucket_mb);
      std::printf("%10s %8s %6s %16s %14s %8s", "size", "buckets", "iters", "parallax GB/s", "MPI GB/s", "ratio");
      std::printf(options.nonblocking ? " %16s\n" : "\n", "MPI_Iallreduce GB/s");
    }
    for (std::int64_t bytes = options.min_kb * 1024; bytes <= options.max_mb * (1 << 20); bytes *= 2) {
      const std::int64_t elements = bytes / 4;
      at::Tensor buffer = at::zeros({elements}, at::kFloat);  // zeros: sums stay finite
      std::vector<at::Tensor> buckets;
      for (std::int64_t offset = 0; offset < elements; offset += bucket_elements) {
        buckets.push_back(buffer.narrow(0, offset, std::min(bucket_elements, elements - offset)));
      }
      const int iters = iterations_for(options, bytes);
      const auto run_parallax = [&] {
        std::vector<parallax::WorkPtr> works;
        works.reserve(buckets.size());
        for (auto& bucket : buckets) works.push_back(comm.all_reduce(bucket));
        for (auto& work : works) work->wait();
      };
      const auto run_mpi = [&] {
        parallax::check_mpi(MPI_Allreduce(MPI_IN_PLACE, buffer.data_ptr(), static_cast<int>(elements), MPI_FLOAT,
                                          MPI_SUM, MPI_COMM_WORLD),
                            "MPI_Allreduce");
      };
      const auto run_nonblocking = [&] {
        std::vector<MPI_Request> requests(buckets.size(), MPI_REQUEST_NULL);
        for (std::size_t b = 0; b < buckets.size(); ++b) {
          parallax::check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buckets[b].data_ptr(), static_cast<int>(buckets[b].numel()),
                                             MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &requests[b]),
                              "MPI_Iallreduce");
        }
        parallax::check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
                            "MPI_Waitall");
      };
      // The contenders alternate, iteration by iteration, so that load from elsewhere on the
      // machine falls on both alike.
      std::vector<double> parallax_times;
      std::vector<double> mpi_times;
      std::vector<double> nonblocking_times;
      for (int i = 0; i < options.warmup + iters; ++i) {
        const double parallax_t = timed(run_parallax);
        const double mpi_t = timed(run_mpi);
        const double nonblocking_t = options.nonblocking ? timed(run_nonblocking) : 1.0;
        if (i < options.warmup) continue;
        parallax_times.push_back(parallax_t);
        mpi_times.push_back(mpi_t);
        nonblocking_times.push_back(nonblocking_t);
      }
      const double parallax_s = median(parallax_times);
      const double mpi_s = median(mpi_times);
      const double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
      const double parallax_bw = factor * static_cast<double>(bytes) / parallax_s / 1e9;
      const double mpi_bw = factor * static_cast<double>(bytes) / mpi_s / 1e9;
      if (lead) {
        std::printf("%10s %8zu %6d %16.3f %14.3f %8.2f", human(bytes).c_str(), buckets.size(), iters, parallax_bw,
                    mpi_bw, parallax_bw / mpi_bw);
        if (options.nonblocking) {
          std::printf(" %16.3f", factor * static_cast<double>(bytes) / median(nonblocking_times) / 1e9);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    parallax::World::abort(1);
  }
  return 0;
}
