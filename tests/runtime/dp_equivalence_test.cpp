// Data parallelism computes what one process computes: the GPT example trained with the
// engine on every rank of the world must match a plain single-process LibTorch run of the
// same global batch, step by step (losses) and at the end (parameters).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "gpt_training.h"
#include "parallax/runtime/parallax.h"

namespace {

using namespace equivalence;

class DataParallelEquivalence : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(DataParallelEquivalence, MatchesSingleProcessFp32) {
  const auto config = make_config(GetParam());
  const Trajectory reference = train_reference(config);
  const DistributedRun run = train_distributed(config);
  // fp32: the all-reduce sums in another order than one process does.
  expect_equivalent(run.trajectory, reference, kFp32LossTolerance, kFp32ParameterTolerance);
  EXPECT_LT(reference.losses.back(), reference.losses.front());
}

TEST_P(DataParallelEquivalence, AllReducePayloadEqualsGradientBytes) {
  const DistributedRun run = train_distributed(make_config(GetParam()));
  ASSERT_GT(run.buckets, 1u);
  const int world = static_cast<int>(run.metrics.front().comm.size());
  for (const auto& m : run.metrics) {
    ASSERT_EQ(static_cast<int>(m.comm.size()), world);
    for (int r = 0; r < world; ++r) {
      const auto& all_reduce = m.comm[r][parallax::CommOp::kAllReduce];
      // One all-reduce per bucket per optimizer step, whatever grad_accum is, and one of
      // a byte per parameter: which have gradients (gradient_presence.h).
      const auto parameters = static_cast<std::int64_t>(run.trajectory.params.size());
      EXPECT_EQ(all_reduce.calls, static_cast<std::int64_t>(run.buckets) + 1) << "rank " << r;
      EXPECT_EQ(all_reduce.bytes, run.gradient_bytes + run.padding_bytes + parameters) << "rank " << r;
      EXPECT_EQ(m.comm[r][parallax::CommOp::kBroadcast].calls, 0);
      EXPECT_EQ(m.model_state_bytes[r].grads, run.gradient_bytes + run.padding_bytes);
      // AdamW: two fp32 moments per parameter.
      EXPECT_EQ(m.model_state_bytes[r].optimizer, 2 * m.model_state_bytes[r].params);
      // The step's peaks: the model state and the activations at once, within what the
      // process held (mutant: the peaks not gathered, -1).
      const parallax::ModelStateBytes& state = m.model_state_bytes[r];
      ASSERT_EQ(m.peak_memory.size(), static_cast<std::size_t>(world));
      EXPECT_GT(m.peak_memory[r].allocated, state.params + state.grads + state.optimizer) << "rank " << r;
      EXPECT_GE(m.peak_memory[r].resident, m.peak_memory[r].allocated) << "rank " << r;
    }
  }
  EXPECT_EQ(run.padding_bytes, 0);
}

TEST_P(DataParallelEquivalence, Bf16MatchesTheSameRecipeInOneProcess) {
  const auto config = make_config(GetParam(), {"precision.dtype=\"bf16\""});
  // The reference runs bf16 as the engine does (gpt_training.h) and the fp32 masters are
  // compared, not the bf16 copies. Measured: bit-identical on 2 and 4 ranks; an fp32 sum
  // in another order flips a bf16 rounding now and then, which Adam carries to 2.0e-6
  // (loss, relative) and 9.3e-5 (parameters). Masters rounded to bf16 after each step
  // (no fp32 masters at all) reach 7.0e-4 and 1.65e-2.
  const Trajectory reference = train_reference(config);
  const DistributedRun run = train_distributed(config);
  expect_equivalent(run.trajectory, reference, 2e-5, 1e-3);
  EXPECT_LT(run.trajectory.losses.back(), run.trajectory.losses.front());
  // Gradients are accumulated and all-reduced in fp32: 4 bytes per parameter.
  std::int64_t elements = 0;
  for (const auto& p : reference.params) elements += p.numel();
  EXPECT_EQ(run.gradient_bytes, 4 * elements);
  for (const auto& m : run.metrics) {
    EXPECT_EQ(m.comm[0][parallax::CommOp::kAllReduce].bytes,
              4 * elements + static_cast<std::int64_t>(reference.params.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(GradAccum, DataParallelEquivalence, ::testing::Values(1, 2), [](const auto& info) {
  return "grad_accum_" + std::to_string(info.param);
});

}  // namespace
