// SideStreamCopies (offload/side_stream.h): copies between a device and pinned host
// memory on a side stream, ordered after the compute stream's queued work. Label gpu:
// the device cases skip, saying why, without a CUDA device; the CPU case runs anywhere
// (scripts/gpu-check.sh runs both kinds, --cpu in CI).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "parallax/offload/side_stream.h"

namespace parallax::offload {
namespace {

#define SKIP_WITHOUT_CUDA()                                                           \
  if (!torch::cuda::is_available()) {                                                 \
    GTEST_SKIP() << "needs a CUDA device (LibTorch without CUDA, or no GPU visible)"; \
  }

TEST(SideStreamCopies, OnTheCpuACopyIsDoneWhenItReturns) {
  SideStreamCopies copies(torch::kCPU);
  const torch::Tensor source = torch::arange(1000, torch::kFloat32);
  torch::Tensor destination = copies.host_buffer(1000, torch::kBFloat16);
  const HostCopy copy = copies.copy(destination, source);
  EXPECT_TRUE(copy.done());
  copy.order_current_stream();
  EXPECT_TRUE(torch::equal(destination, source.to(torch::kBFloat16)));
}

// The copy waits for the compute stream's queued work (a kernel that writes the source
// after a long chain of matmuls), returns before it has run, and wait() then sees every
// value. Mutant caught: no event from the compute stream (the side stream copies the
// source before the kernel that writes it: the host sees the old values).
TEST(SideStreamCopies, ADeviceToHostCopyRunsAfterTheComputeStreamsWorkWithoutBlockingTheCaller) {
  SKIP_WITHOUT_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  SideStreamCopies copies(device);
  constexpr std::int64_t kElements = 16 << 20;
  torch::Tensor source = torch::zeros({kElements}, torch::TensorOptions().device(device));
  torch::Tensor destination = copies.host_buffer(kElements, torch::kFloat32);
  EXPECT_TRUE(destination.is_pinned());
  torch::Tensor a = torch::randn({4096, 4096}, torch::TensorOptions().device(device));
  for (int i = 0; i < 20; ++i) a = torch::tanh(a.matmul(a));  // busy the compute stream for a while
  source.add_(a.sum().mul(0).add(3));                         // then write the source: all 3
  const HostCopy copy = copies.copy(destination, source);
  EXPECT_FALSE(copy.done()) << "copy() waited for the compute stream's work";
  copy.wait();
  EXPECT_TRUE(copy.done());
  EXPECT_TRUE(torch::equal(destination, torch::full({kElements}, 3.0f)));
}

// A host-to-device copy, then work on the compute stream ordered after it, reads every
// value. Mutant caught: order_current_stream() a no-op (the compute stream's sum reads
// the destination before the side stream has written it).
TEST(SideStreamCopies, TheComputeStreamOrderedAfterAHostToDeviceCopyReadsItsValues) {
  SKIP_WITHOUT_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  SideStreamCopies copies(device);
  constexpr std::int64_t kElements = 16 << 20;
  torch::Tensor source = copies.host_buffer(kElements, torch::kBFloat16).fill_(2);
  torch::Tensor destination = torch::zeros({kElements}, torch::TensorOptions().device(device).dtype(torch::kBFloat16));
  copies.copy(destination, source).order_current_stream();
  EXPECT_EQ(destination.to(torch::kFloat64).sum().item<double>(), 2.0 * kElements);
}

}  // namespace
}  // namespace parallax::offload
