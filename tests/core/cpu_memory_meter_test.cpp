// CpuMemoryMeter on its own: exact live and peak bytes of LibTorch's CPU allocator,
// blocks that outlive the meter, and a limit that refuses an allocation cleanly.
// Mutants caught: the free not subtracted (live stays at 4096 after the tensor dies);
// the limit checked after the allocation was counted (live 2048 bytes high after the
// refusal).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "parallax/core/cpu_memory_meter.h"

namespace parallax {
namespace {

TEST(CpuMemoryMeter, CountsLiveAndPeakBytesExactly) {
  CpuMemoryMeter meter;
  EXPECT_EQ(meter.live_bytes(), 0);
  {
    const torch::Tensor a = torch::empty({1024}, torch::kFloat32);  // 4096 bytes
    EXPECT_EQ(meter.live_bytes(), 4096);
    {
      const torch::Tensor b = torch::empty({256}, torch::kFloat64);  // 2048 bytes
      EXPECT_EQ(meter.live_bytes(), 6144);
    }
    EXPECT_EQ(meter.live_bytes(), 4096);
    EXPECT_EQ(meter.peak_bytes(), 6144);
    meter.reset_peak();
    EXPECT_EQ(meter.peak_bytes(), 4096);
  }
  EXPECT_EQ(meter.live_bytes(), 0);
}

TEST(CpuMemoryMeter, ABlockFreedAfterTheMeterClosedFindsItsCounts) {
  torch::Tensor survivor;
  {
    CpuMemoryMeter meter;
    survivor = torch::ones({64});
    EXPECT_EQ(meter.live_bytes(), 256);
  }
  EXPECT_EQ(survivor.sum().item<float>(), 64.0f);  // the allocator is back; the block is intact
  survivor = torch::Tensor();                       // freed through the closed meter's counts
  CpuMemoryMeter next;                              // a new meter counts from its opening
  EXPECT_EQ(next.live_bytes(), 0);
}

TEST(CpuMemoryMeter, ALimitRefusesTheAllocationThatPassesItAndCountsNothingForIt) {
  CpuMemoryMeter meter(CpuMemoryMeter::Options().limit_bytes(3 << 10));
  const torch::Tensor a = torch::empty({512}, torch::kFloat32);  // 2 KiB of 3
  try {
    const torch::Tensor b = torch::empty({512}, torch::kFloat32);
    ADD_FAILURE() << "4 KiB fitted a 3 KiB limit";
  } catch (const MemoryLimitError& error) {
    EXPECT_NE(std::string(error.detail()).find("passes the limit of 3072 bytes (this rank's memory limit)"),
              std::string::npos)
        << error.detail();
  }
  EXPECT_EQ(meter.live_bytes(), 2048);
  EXPECT_EQ(meter.peak_bytes(), 2048);
  const torch::Tensor c = torch::empty({256}, torch::kFloat32);  // 1 KiB more fits exactly
  EXPECT_EQ(meter.live_bytes(), 3072);
}

TEST(CpuMemoryMeter, TheRefusalNamesThePhaseAndTheLimitsSource) {
  CpuMemoryMeter meter(CpuMemoryMeter::Options().limit_bytes(1 << 10).source("memory.limit_mb = 0.001, rank 2 of 4"));
  try {
    const MemoryPhase phase("the optimizer step");
    const torch::Tensor a = torch::empty({512}, torch::kFloat32);
    ADD_FAILURE() << "2 KiB fitted a 1 KiB limit";
  } catch (const MemoryLimitError& error) {
    EXPECT_NE(std::string(error.detail())
                  .find("allocating 2048 bytes during the optimizer step, with 0 bytes live, passes the limit of 1024 "
                        "bytes (memory.limit_mb = 0.001, rank 2 of 4)"),
              std::string::npos)
        << error.detail();
  }
  EXPECT_THROW(torch::empty({512}, torch::kFloat32), MemoryLimitError);  // "outside the engine" again
}

TEST(CpuMemoryMeter, MetersNestAndABlockCountsInEveryMeterOpenAtItsAllocation) {
  CpuMemoryMeter outer;
  const torch::Tensor a = torch::empty({256}, torch::kFloat32);  // 1 KiB, outer's only
  {
    CpuMemoryMeter inner(CpuMemoryMeter::Options().limit_bytes(4 << 10));
    const torch::Tensor b = torch::empty({512}, torch::kFloat32);  // 2 KiB, in both
    EXPECT_EQ(inner.live_bytes(), 2048);
    EXPECT_EQ(outer.live_bytes(), 3072);
    EXPECT_THROW(torch::empty({1024}, torch::kFloat32), MemoryLimitError);  // the inner limit holds
    EXPECT_EQ(outer.live_bytes(), 3072);
  }
  EXPECT_EQ(outer.live_bytes(), 1024);
  EXPECT_EQ(outer.peak_bytes(), 3072);
  EXPECT_THROW(CpuMemoryMeter(CpuMemoryMeter::Options().limit_bytes(-1)), UsageError);
}

// Last in this file: the first meter stays installed for the rest of the process.
TEST(CpuMemoryMeter, AMeterClosedOutOfOrderStaysInstalledAndCounting) {
  auto first = std::make_unique<CpuMemoryMeter>();
  CpuMemoryMeter second;
  first.reset();  // `second` still allocates through it
  const torch::Tensor a = torch::empty({256}, torch::kFloat32);
  EXPECT_EQ(second.live_bytes(), 1024);
}

}  // namespace
}  // namespace parallax
