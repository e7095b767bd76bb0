// The offloaded optimizer's host side on one process: the NVMe tier's tiled, double-
// buffered step is bit-identical to the in-memory step for any tile size and buffer
// count (the update is element-wise, so tiling must not change one bit), its traffic
// is exactly the file's contents once each way per step, the in-memory step follows
// torch::optim::AdamW across shards, and the tier's file never has a name.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "parallax/core/cpu_binding.h"
#include "parallax/core/error.h"
#include "parallax/offload/intra_op_pool.h"
#include "parallax/offload/offloaded_adam.h"
#include "parallax/offload/swap_file.h"

namespace {

namespace fs = std::filesystem;
using parallax::offload::CpuAdamOptions;
using parallax::offload::OffloadedAdam;
using parallax::offload::OffloadedAdamOptions;
using parallax::offload::SwapFile;

#define EXPECT_CONTAINS(text, needle) EXPECT_NE(std::string(text).find(needle), std::string::npos) << "in: " << (text)

class ScratchDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("parallax_offload_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  bool directory_is_empty() const { return fs::is_empty(dir_); }
  // Descriptors of this process that point at a deleted file under the directory.
  int deleted_files_open() const {
    int count = 0;
    for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
      std::error_code error;
      const std::string target = fs::read_symlink(entry.path(), error).string();
      if (!error && target.rfind(dir_.string() + "/parallax-swap-", 0) == 0 &&
          target.find("(deleted)") != std::string::npos) {
        ++count;
      }
    }
    return count;
  }
  fs::path dir_;
};

OffloadedAdamOptions adamw_options() {
  OffloadedAdamOptions options;
  options.adam = CpuAdamOptions(1e-2).betas(0.9, 0.95).eps(1e-8).weight_decay(0.1).decoupled(true);
  options.owner = "rank 0 (test)";
  return options;
}

std::vector<torch::Tensor> random_shards(const std::vector<std::int64_t>& sizes) {
  std::vector<torch::Tensor> shards;
  for (std::int64_t n : sizes) shards.push_back(torch::randn({n}));
  return shards;
}

std::vector<torch::Tensor> masters_of(const OffloadedAdam& adam, const std::vector<std::int64_t>& sizes) {
  std::vector<torch::Tensor> out;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(torch::empty({sizes[i]}));
    adam.read_master(i, out.back());
  }
  return out;
}

struct Tiling {
  std::int64_t buffer_bytes;
  std::int64_t buffer_count;
  bool masters_on_nvme;
};

class NvmeTier : public ScratchDirectory, public ::testing::WithParamInterface<Tiling> {};

TEST_P(NvmeTier, StepsBitIdenticallyToTheInMemoryStepAndMovesTheFileOnceEachWay) {
  const std::vector<std::int64_t> sizes{1000, 7, 333};  // T = 1340: tiles never divide it
  const std::int64_t total = 1340;
  torch::manual_seed(7);
  const auto initial = random_shards(sizes);
  OffloadedAdamOptions memory_options = adamw_options();
  OffloadedAdamOptions nvme_options = adamw_options();
  nvme_options.moments_on_nvme = true;
  nvme_options.masters_on_nvme = GetParam().masters_on_nvme;
  nvme_options.nvme_path = dir_.string();
  nvme_options.buffer_bytes = GetParam().buffer_bytes;
  nvme_options.buffer_count = GetParam().buffer_count;
  OffloadedAdam in_memory(memory_options, initial);
  OffloadedAdam tiered(nvme_options, initial);
  const std::int64_t streams = GetParam().masters_on_nvme ? 3 : 2;
  EXPECT_EQ(tiered.nvme_bytes(), streams * total * 4);
  EXPECT_EQ(tiered.tile_elements(), std::min<std::int64_t>(total, GetParam().buffer_bytes / (4 * streams)));
  EXPECT_TRUE(directory_is_empty());  // the file is open but has no name
  EXPECT_EQ(deleted_files_open(), 1);
  const std::int64_t written_at_start = tiered.nvme_bytes_written();
  EXPECT_EQ(written_at_start, GetParam().masters_on_nvme ? total * 4 : 0);

  constexpr int kSteps = 6;
  for (int step = 0; step < kSteps; ++step) {
    const double lr = 1e-2 * (step + 1);
    for (auto* adam : {&in_memory, &tiered}) adam->set_learning_rate(lr);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const torch::Tensor grad = torch::randn({sizes[i]});
      in_memory.gradient(i).copy_(grad);
      tiered.gradient(i).copy_(grad);
    }
    in_memory.step();
    tiered.step();
  }
  EXPECT_EQ(tiered.step_count(), kSteps);
  EXPECT_EQ(tiered.nvme_bytes_read(), kSteps * streams * total * 4);
  EXPECT_EQ(tiered.nvme_bytes_written(), written_at_start + kSteps * streams * total * 4);
  const auto want = masters_of(in_memory, sizes);
  const auto got = masters_of(tiered, sizes);
  for (std::size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << "shard " << i;
  // Reading a master converts to the destination's dtype.
  torch::Tensor bf16 = torch::empty({sizes[2]}, torch::kBFloat16);
  tiered.read_master(2, bf16);
  EXPECT_TRUE(torch::equal(bf16, want[2].to(torch::kBFloat16)));
}

INSTANTIATE_TEST_SUITE_P(Tilings,
                         NvmeTier,
                         ::testing::Values(Tiling{512, 2, false},      // 64 elements per tile, 21 tiles
                                           Tiling{512, 3, false},      // read two tiles ahead
                                           Tiling{1200, 5, true},      // 100-element tiles with masters
                                           Tiling{1 << 20, 4, true}),  // one tile holds everything
                         [](const auto& info) {
                           return "bytes_" + std::to_string(info.param.buffer_bytes) + "_buffers_" +
                                  std::to_string(info.param.buffer_count) +
                                  (info.param.masters_on_nvme ? "_masters" : "");
                         });

TEST(OffloadedAdam, FollowsTorchAdamWAcrossShards) {
  const std::vector<std::int64_t> sizes{257, 64, 31};
  torch::manual_seed(3);
  const auto initial = random_shards(sizes);
  OffloadedAdam adam(adamw_options(), initial);
  std::vector<torch::Tensor> reference;
  for (const auto& shard : initial) reference.push_back(shard.clone().requires_grad_(true));
  torch::optim::AdamW torch_adamw(reference,
                                  torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  for (int step = 0; step < 50; ++step) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const torch::Tensor grad = torch::randn({sizes[i]});
      reference[i].mutable_grad() = grad.clone();
      adam.gradient(i).copy_(grad);
    }
    torch_adamw.step();
    adam.step();
  }
  const auto got = masters_of(adam, sizes);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double worst =
        ((got[i] - reference[i].detach()).abs() / (reference[i].detach().abs() + 1)).max().item<double>();
    EXPECT_LE(worst, 1e-6) << "shard " << i;
  }
  // Gradients, masters and two moments: 16 bytes per element, all on the host.
  EXPECT_EQ(adam.host_bytes(), 16 * (257 + 64 + 31));
  EXPECT_EQ(adam.nvme_bytes(), 0);
}

TEST(CpuAdamThreads, EachIntraOpThreadRunsOnItsPu) {
  at::set_num_threads(2);
  const std::vector<int> pus = parallax::rank_cpu_share(0, 1);
  const std::vector<int> bound = parallax::offload::CpuAdam::bind_threads(pus);
  ASSERT_EQ(bound.size(), static_cast<std::size_t>(at::get_num_threads()));
  std::vector<std::string> seen(bound.size());
  parallax::offload::intra_op_parallel_for(static_cast<std::int64_t>(bound.size()), 1, [&](std::int64_t, std::int64_t) {
    seen[static_cast<std::size_t>(parallax::offload::intra_op_thread_index())] = parallax::calling_thread_binding();
  });
  for (std::size_t t = 0; t < bound.size(); ++t) {
    EXPECT_EQ(bound[t], pus[t % pus.size()]);
    EXPECT_EQ(seen[t], std::to_string(bound[t])) << "thread " << t;
  }
}

TEST_F(ScratchDirectory, SwapFileIsNamelessReservedAndFreedOnDestruction) {
  {
    SwapFile file(dir_.string(), 1 << 16, "rank 0 (test)");
    EXPECT_TRUE(directory_is_empty());
    EXPECT_EQ(deleted_files_open(), 1);
    std::vector<float> out(1000), back(1000);
    for (int i = 0; i < 1000; ++i) out[i] = static_cast<float>(i) * 0.5f;
    auto written = file.write_async(4096, out.data(), 4000);
    auto read = file.read_async(4096, back.data(), 4000);  // FIFO: after the write
    read.get();
    written.get();
    EXPECT_EQ(back, out);
    EXPECT_EQ(file.bytes_written(), 4000);
    EXPECT_EQ(file.bytes_read(), 4000);
  }
  EXPECT_EQ(deleted_files_open(), 0);
  EXPECT_TRUE(directory_is_empty());
}

TEST_F(ScratchDirectory, SwapFileErrorsNameTheKeyTheOwnerAndTheReason) {
  const std::string missing = (dir_ / "no-such-directory").string();
  EXPECT_THROW(
      {
        try {
          SwapFile file(missing, 4096, "rank 5 on node7");
        } catch (const parallax::ConfigError& e) {
          EXPECT_CONTAINS(e.detail(), "offload.nvme_path = \"" + missing + "\": rank 5 on node7");
          EXPECT_CONTAINS(e.detail(), "No such file or directory");
          throw;
        }
      },
      parallax::ConfigError);
  const std::string regular_file = (dir_ / "a-file").string();
  std::ofstream(regular_file) << "x";
  EXPECT_THROW(SwapFile(regular_file, 4096, "rank 0"), parallax::ConfigError);
  fs::remove(regular_file);
  // More than any drive holds: refused at start, not in the middle of a step.
  EXPECT_THROW(
      {
        try {
          SwapFile file(dir_.string(), std::int64_t{1} << 60, "rank 0");
        } catch (const parallax::ConfigError& e) {
          EXPECT_CONTAINS(e.detail(), "cannot reserve 1152921504606846976 bytes");
          throw;
        }
      },
      parallax::ConfigError);
  EXPECT_TRUE(directory_is_empty());
  EXPECT_EQ(deleted_files_open(), 0);
}

}  // namespace
