// The fused CPU Adam/AdamW against LibTorch's torch::optim::Adam / AdamW: 100 steps on
// random data, sizes that are not multiples of any vector width (and one that spans
// several threads' chunks), weight decay on and off, fp32 and bf16 gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "figures.h"
#include "parallax/core/error.h"
#include "parallax/offload/cpu_adam.h"
#include "parallax/offload/intra_op_pool.h"

namespace parallax::offload {
namespace {

constexpr int kSteps = 100;

struct Case {
  std::int64_t numel;
  bool decoupled;
  double weight_decay;
};

// Max over elements of |ours − LibTorch| / (|LibTorch| + 1): relative for parameters of
// magnitude 1 and above (these are N(0, 1)), absolute below, as allclose(rtol = atol).
// Where Adam's denominator is tiny (√v ≪ ε) a one-ulp difference in the moment is
// amplified, so a purely relative bound on parameters near 0 would measure that, not
// the kernel.
double worst_relative(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).abs() / (want.abs() + 1.0)).max().item<double>();
}

class CpuAdamAgainstLibTorch : public ::testing::TestWithParam<std::tuple<std::int64_t, bool, double>> {};

TEST_P(CpuAdamAgainstLibTorch, HundredStepsAgree) {
  const auto [numel, decoupled, weight_decay] = GetParam();
  torch::manual_seed(numel);
  const double lr = 1e-3;
  torch::Tensor reference = torch::randn({numel}).requires_grad_(true);
  torch::Tensor params = reference.detach().clone();
  torch::Tensor exp_avg = torch::zeros({numel}), exp_avg_sq = torch::zeros({numel});
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (decoupled) {
    optimizer = std::make_unique<torch::optim::AdamW>(
        std::vector<torch::Tensor>{reference},
        torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(weight_decay));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(
        std::vector<torch::Tensor>{reference},
        torch::optim::AdamOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(weight_decay));
  }
  const CpuAdam adam(CpuAdamOptions(lr).betas(0.9, 0.95).eps(1e-8).weight_decay(weight_decay).decoupled(decoupled));
  for (int step = 1; step <= kSteps; ++step) {
    const torch::Tensor grad = torch::randn({numel}) * (step % 7 == 0 ? 100.0 : 0.1);
    reference.mutable_grad() = grad.clone();
    optimizer->step();
    adam.step(params.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
              numel, step);
  }
  const double worst = worst_relative(params, reference.detach());
  EXPECT_LE(worst, 1e-6) << CpuAdam::instruction_set();
  parallax_test::print_figure("numel %lld %s wd %g (%s): worst relative difference after %d steps %.3g\n",
                              static_cast<long long>(numel), decoupled ? "adamw" : "adam", weight_decay,
                              CpuAdam::instruction_set(), kSteps, worst);
}

INSTANTIATE_TEST_SUITE_P(Sizes,
                         CpuAdamAgainstLibTorch,
                         ::testing::Combine(::testing::Values(1, 7, 1000, 200003),
                                            ::testing::Bool(),
                                            ::testing::Values(0.0, 0.1)));

TEST(CpuAdam, Bf16GradientsAreWidenedInThePass) {
  const std::int64_t numel = 1025;
  torch::manual_seed(1);
  torch::Tensor a = torch::randn({numel}), b = a.clone();
  torch::Tensor m1 = torch::zeros({numel}), v1 = torch::zeros({numel}), m2 = m1.clone(), v2 = v1.clone();
  const CpuAdam adam(CpuAdamOptions(1e-2).weight_decay(0.01).decoupled(true));
  for (int step = 1; step <= 10; ++step) {
    const torch::Tensor grad = torch::randn({numel}).to(torch::kBFloat16);
    const torch::Tensor wide = grad.to(torch::kFloat32);
    adam.step(a.data_ptr<float>(), reinterpret_cast<const std::uint16_t*>(grad.data_ptr<at::BFloat16>()),
              m1.data_ptr<float>(), v1.data_ptr<float>(), numel, step);
    adam.step(b.data_ptr<float>(), wide.data_ptr<float>(), m2.data_ptr<float>(), v2.data_ptr<float>(), numel, step);
  }
  EXPECT_TRUE(torch::equal(a, b));  // widening bf16 is exact
}

TEST(CpuAdam, RejectsOptionsOutsideTheirRanges) {
  EXPECT_THROW(CpuAdam(CpuAdamOptions(0)), ConfigError);
  EXPECT_THROW(CpuAdam(CpuAdamOptions(1e-3).betas(1.0, 0.9)), ConfigError);
  EXPECT_THROW(CpuAdam(CpuAdamOptions(1e-3).eps(0)), ConfigError);
  const CpuAdam adam(CpuAdamOptions(1e-3));
  float x = 0;
  EXPECT_THROW(adam.step(&x, &x, &x, &x, 1, 0), UsageError);
}

// The pool the kernel runs on is LibTorch's, sized by at::set_num_threads, whichever
// compiler built it (a Clang build without it ran every chunk on one thread).
TEST(IntraOpPool, ChunksCoverTheRangeOnceOnEveryThread) {
  at::set_num_threads(2);
  const std::int64_t n = 1000;
  std::vector<int> hits(n, 0);
  std::set<int> threads;
  std::mutex mutex;
  intra_op_parallel_for(n, 100, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) ++hits[i];
    const std::lock_guard<std::mutex> lock(mutex);
    threads.insert(intra_op_thread_index());
  });
  EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), n);
  EXPECT_EQ(threads, (std::set<int>{0, 1}));
  // One grain's worth runs inline on the caller.
  int calls = 0;
  intra_op_parallel_for(100, 100, [&](std::int64_t begin, std::int64_t end) {
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 100);
  });
  EXPECT_EQ(calls, 1);
}

TEST(IntraOpPool, AChunksExceptionReachesTheCaller) {
  at::set_num_threads(2);
  EXPECT_THROW(intra_op_parallel_for(1000, 1,
                                     [&](std::int64_t begin, std::int64_t) {
                                       if (begin > 0) throw std::runtime_error("second chunk failed");
                                     }),
               std::runtime_error);
  EXPECT_THROW(intra_op_parallel_for(10, 0, [](std::int64_t, std::int64_t) {}), UsageError);
}

}  // namespace
}  // namespace parallax::offload
