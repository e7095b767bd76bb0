// Offloaded ZeRO computes what one process computes: the GPT example trained with the
// optimizer (and at stage 3 the parameters) on the host or the NVMe tier, on every
// rank of the world, against the single-process LibTorch reference and against the
// same ZeRO stage without offload. The bytes each rank holds on the device, on the
// host and in the tier's file follow ZeRO-Offload's accounting exactly, and the tier
// leaves no file behind.
//
// Notation as in zero_equivalence_test: Ψ' = Ψ + padding, N ranks, T = Ψ'/N elements of
// this rank's shards. fp32 AdamW.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "figures.h"
#include "gpt.h"
#include "gpt_training.h"
#include "parallax/core/cpu_binding.h"
#include "parallax/planner/model_state.h"
#include "parallax/runtime/parallax.h"

namespace {

namespace fs = std::filesystem;
using namespace equivalence;

// Same on every rank (the configs must hash alike): the launcher is their common parent.
fs::path scratch_directory() {
  return fs::temp_directory_path() / ("parallax_offload_equivalence_" + std::to_string(::getppid()));
}

constexpr double kBufferMegabytes = 0.01;  // 10,485 bytes: several tiles per shard here

struct Variant {
  int stage;
  std::string optimizer;  // cpu | nvme
  std::string param;      // none | cpu | nvme
  std::int64_t buffer_count;
  std::string name() const {
    return "stage_" + std::to_string(stage) + "_" + optimizer + (param == "none" ? "" : "_param_" + param) +
           "_buffers_" + std::to_string(buffer_count);
  }
  bool nvme() const { return optimizer == "nvme" || param == "nvme"; }
};

std::vector<std::string> overrides(const Variant& v) {
  std::vector<std::string> out{"zero.stage=" + std::to_string(v.stage),
                               "zero.wrap=[\"Block\"]",
                               "offload.optimizer=\"" + v.optimizer + "\"",
                               "offload.param=\"" + v.param + "\"",
                               "offload.buffer_mb=" + std::to_string(kBufferMegabytes),
                               "offload.buffer_count=" + std::to_string(v.buffer_count)};
  if (v.nvme()) out.push_back("offload.nvme_path=\"" + scratch_directory().string() + "\"");
  return out;
}

class OffloadEquivalence : public ::testing::TestWithParam<std::tuple<Variant, std::int64_t>> {
 protected:
  void SetUp() override { fs::create_directories(scratch_directory()); }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);  // every rank is done with the directory
    EXPECT_TRUE(fs::is_empty(scratch_directory())) << "the NVMe tier left a file behind";
    MPI_Barrier(MPI_COMM_WORLD);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) fs::remove_all(scratch_directory());
  }
  const Variant& variant() const { return std::get<0>(GetParam()); }
  std::int64_t grad_accum() const { return std::get<1>(GetParam()); }
};

TEST_P(OffloadEquivalence, MatchesTheReferenceAndTheSameStageWithoutOffload) {
  const auto config = make_config(grad_accum(), overrides(variant()));
  const Trajectory reference = train_reference(config);
  const DistributedRun offloaded = train_distributed(config);
  expect_equivalent(offloaded.trajectory, reference, kFp32LossTolerance, kFp32ParameterTolerance);
  const DistributedRun on_device = train_distributed(
      make_config(grad_accum(), {"zero.stage=" + std::to_string(variant().stage), "zero.wrap=[\"Block\"]"}));
  expect_equivalent(offloaded.trajectory, on_device.trajectory, kFp32LossTolerance, kFp32ParameterTolerance);
}

TEST_P(OffloadEquivalence, BytesOnDeviceHostAndNvmeFollowZeroOffload) {
  const Variant& v = variant();
  const DistributedRun run = train_distributed(make_config(grad_accum(), overrides(v)));
  const std::int64_t n = static_cast<std::int64_t>(run.metrics.front().comm.size());
  const std::int64_t padded = run.parameter_elements + run.padding_bytes / 4;  // Ψ'
  const std::int64_t t = padded / n;
  // The planner's formula (planner/model_state.h) for this rank's shard of fp32 Adam
  // state: the engine's bytes on the device, the host and the NVMe tier must equal it.
  parallax::OffloadOptions offload;
  offload.optimizer = v.optimizer == "nvme" ? parallax::OffloadTarget::kNvme : parallax::OffloadTarget::kCpu;
  offload.param = v.param == "none"  ? parallax::OffloadTarget::kNone
                  : v.param == "cpu" ? parallax::OffloadTarget::kCpu
                                     : parallax::OffloadTarget::kNvme;
  offload.buffer_mb = kBufferMegabytes;
  offload.buffer_count = v.buffer_count;
  const parallax::ModelStateBytes want = parallax::offloaded_model_state_formula(
      run.parameter_elements, run.padding_bytes / 4, static_cast<int>(n), v.stage, parallax::Dtype::kFp32, 8, offload);
  for (const auto& m : run.metrics) {
    for (std::size_t r = 0; r < m.model_state_bytes.size(); ++r) {
      const auto& got = m.model_state_bytes[r];
      EXPECT_EQ(got.params, want.params) << "rank " << r << " step " << m.step;
      EXPECT_EQ(got.grads, want.grads) << "rank " << r << " step " << m.step;
      EXPECT_EQ(got.optimizer, want.optimizer) << "rank " << r << " step " << m.step;
      EXPECT_EQ(got.host, want.host) << "rank " << r << " step " << m.step;
      EXPECT_EQ(got.nvme, want.nvme) << "rank " << r << " step " << m.step;
    }
  }
  parallax_test::print_figure(
      "%s, N %lld: bytes per rank device %lld (params %lld, grads %lld), host %lld, nvme %lld; "
      "without offload %lld on the device\n",
      v.name().c_str(), static_cast<long long>(n), static_cast<long long>(want.params + want.grads),
      static_cast<long long>(want.params), static_cast<long long>(want.grads), static_cast<long long>(want.host),
      static_cast<long long>(want.nvme),
      static_cast<long long>((v.stage == 3 ? 4 * t : 4 * padded) + (v.stage == 1 ? 4 * padded : 4 * t) + 8 * t));
}

// A directory only rank 0's "node" has (the same path, through each process's own
// working directory): every rank fails at engine creation, with its own reason or
// with the count of peers that failed, instead of waiting for them.
TEST(OffloadSetup, ANodeWithoutTheNvmeDirectoryFailsEveryRankInsteadOfHangingThem) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks == 1) GTEST_SKIP() << "needs a peer";
  const fs::path home = scratch_directory() / ("rank" + std::to_string(rank));
  fs::create_directories(rank == 0 ? home / "tier" : home);
  const fs::path previous = fs::current_path();
  fs::current_path(home);
  const std::string path = "/proc/self/cwd/tier";
  const auto config =
      make_config(1, {"zero.stage=2", "offload.optimizer=\"nvme\"", "offload.nvme_path=\"" + path + "\""});
  try {
    train_distributed(config);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const parallax::ConfigError& e) {
    const std::string message = e.detail();
    if (rank == 0) {
      EXPECT_NE(message.find(std::to_string(ranks - 1) + " rank(s) of group"), std::string::npos) << message;
    } else {
      EXPECT_NE(message.find("offload.nvme_path = \"" + path + "\""), std::string::npos) << message;
      EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
    }
  }
  fs::current_path(previous);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(scratch_directory());
}

// The engine binds the CPU Adam's threads (here one: the calling thread) to this rank's
// share of the cores; ranks of this test all share one node.
TEST(OffloadSetup, TheEngineBindsTheOptimizerThreadsToTheRanksCores) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  train_distributed(make_config(1, {"zero.stage=1", "offload.optimizer=\"cpu\""}));
  EXPECT_EQ(parallax::calling_thread_binding(), std::to_string(parallax::rank_cpu_share(rank, ranks).front()));
}

// bf16 parameters with fp32 masters on the host: the same run as bf16 ZeRO on the
// device (bit for bit: the same fused Adam steps the same fp32 shards) and as the bf16
// recipe in one process (gpt_training.h), masters compared, within ZeRO's bf16 bounds
// (zero/zero_equivalence_test.cpp; measured here 8.8e-6 and 1.07e-4).
TEST(OffloadBf16, MatchesTheSameRecipeInOneProcessAndOnTheDevice) {
  for (const auto& [stage, param] : {std::pair<int, std::string>{2, "none"}, {3, "cpu"}}) {
    SCOPED_TRACE("stage " + std::to_string(stage) + ", offload.param = " + param);
    // One thread per pool in both runs: the offloaded optimizer changes the thread budget
    // (thread_budget.h), and pools of other sizes sum in another order.
    const std::vector<std::string> zero{"zero.stage=" + std::to_string(stage), "zero.wrap=[\"Block\"]",
                                        "precision.dtype=\"bf16\"", "threads.intra_op=1", "threads.blas=1"};
    std::vector<std::string> offload = zero;
    offload.insert(offload.end(), {"offload.optimizer=\"cpu\"", "offload.param=\"" + param + "\""});
    const DistributedRun on_host = train_distributed(make_config(1, offload));
    const DistributedRun on_device = train_distributed(make_config(1, zero));
    expect_equivalent(on_host.trajectory, on_device.trajectory, 0.0, 0.0);
    expect_equivalent(on_host.trajectory, train_reference(make_config(1, offload)), 1e-4, 3e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants,
                         OffloadEquivalence,
                         ::testing::Combine(::testing::Values(Variant{1, "cpu", "none", 4},
                                                              Variant{1, "nvme", "none", 2},
                                                              Variant{2, "cpu", "none", 4},
                                                              Variant{2, "nvme", "none", 3},
                                                              Variant{3, "cpu", "none", 4},
                                                              Variant{3, "nvme", "none", 2},
                                                              Variant{3, "cpu", "cpu", 4},
                                                              Variant{3, "nvme", "cpu", 2},
                                                              Variant{3, "nvme", "nvme", 2}),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name() + "_grad_accum_" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
