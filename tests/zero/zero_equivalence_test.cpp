// ZeRO stages 1–3 compute what one process computes, hold the bytes the ZeRO formulas
// say, and move the bytes they say: the GPT example trained
// on every rank of the world against a single-process LibTorch run of the same global
// batch, with the per-rank model-state bytes and per-step communication counters of
// the metrics contract held to exact formulas.
//
// Notation: Ψ trainable parameters, N data-parallel ranks, P the
// padding elements (each flat buffer pads to a multiple of N; ShardedModel reports P),
// Ψ' = Ψ + P, so Ψ'/N is exact. fp32 AdamW: 4 bytes of parameter, 4 of gradient and 8
// of moments per element.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <tuple>

#include "figures.h"
#include "gpt.h"
#include "gpt_training.h"
#include "parallax/runtime/parallax.h"
#include "parallax/zero/sharded_model.h"

namespace {

using namespace equivalence;
using parallax::CommOp;

std::vector<std::string> zero_overrides(int stage, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides{"zero.stage=" + std::to_string(stage), "zero.wrap=[\"Block\"]"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return overrides;
}

// Stage 3: the root unit's gathered bytes (every parameter outside the blocks, padded to
// a multiple of N). The forward uses it last (the head), so it stays gathered into backward.
// The bytes of the unit the forward uses last (padded to n ranks): the root unit's
// parameters (those outside the blocks) of the head's optimizer group, since a unit
// holds one group's parameters (optimizer.no_decay cuts the root unit in two).
std::int64_t root_unit_bytes(const parallax::Config& config, std::int64_t n) {
  const gpt::GPT model(gpt::GPTOptions::from_table(config.app_table("model")));
  auto spec = parallax::OptimizerSpec::from(config);
  parallax::exempt_from_weight_decay(spec, *model);
  const auto group_of = [&](const std::string& name) {
    return spec.group_of.empty() ? std::size_t{0} : spec.group_of.at(name);
  };
  std::int64_t elements = 0;
  for (const auto& p : model->named_parameters()) {
    if (p.key().rfind("blocks.", 0) != 0 && group_of(p.key()) == group_of("head.weight")) {
      elements += p.value().numel();
    }
  }
  return 4 * ((elements + n - 1) / n * n);
}

class ZeroEquivalence : public ::testing::TestWithParam<std::tuple<int, std::int64_t>> {
 protected:
  int stage() const { return std::get<0>(GetParam()); }
  std::int64_t grad_accum() const { return std::get<1>(GetParam()); }
};

TEST_P(ZeroEquivalence, MatchesSingleProcessFp32) {
  const auto config = make_config(grad_accum(), zero_overrides(stage()));
  const Trajectory reference = train_reference(config);
  const DistributedRun run = train_distributed(config);
  // Same bound as plain data parallelism: the reduce-scatter sums in another order,
  // and the clipping norm is summed over shards in float64.
  expect_equivalent(run.trajectory, reference, kFp32LossTolerance, kFp32ParameterTolerance);
}

TEST_P(ZeroEquivalence, ModelStateBytesFollowTheZeroFormulas) {
  const DistributedRun run = train_distributed(make_config(grad_accum(), zero_overrides(stage())));
  const std::int64_t padded = run.parameter_elements + run.padding_bytes / 4;  // Ψ'
  const std::int64_t n = static_cast<std::int64_t>(run.metrics.front().comm.size());
  ASSERT_EQ(padded % n, 0);
  // padding: fewer than N elements per flat buffer
  EXPECT_LT(run.padding_bytes / 4, n * static_cast<std::int64_t>(run.buckets));
  parallax::ModelStateBytes want;
  want.params = stage() == 3 ? 4 * padded / n : 4 * padded;
  want.grads = stage() == 1 ? 4 * padded : 4 * padded / n;
  want.optimizer = 8 * padded / n;
  for (const auto& m : run.metrics) {
    for (std::size_t r = 0; r < m.model_state_bytes.size(); ++r) {
      EXPECT_EQ(m.model_state_bytes[r].params, want.params) << "rank " << r << " step " << m.step;
      EXPECT_EQ(m.model_state_bytes[r].grads, want.grads) << "rank " << r << " step " << m.step;
      EXPECT_EQ(m.model_state_bytes[r].optimizer, want.optimizer) << "rank " << r << " step " << m.step;
    }
  }
  parallax_test::print_figure(
      "stage %d, N %lld: Ψ %lld, padding %lld elements; bytes per rank params %lld grads %lld "
      "optimizer %lld (total %lld vs stage 0 %lld)\n",
      stage(), static_cast<long long>(n), static_cast<long long>(run.parameter_elements),
      static_cast<long long>(run.padding_bytes / 4), static_cast<long long>(want.params),
      static_cast<long long>(want.grads), static_cast<long long>(want.optimizer),
      static_cast<long long>(want.params + want.grads + want.optimizer),
      static_cast<long long>(16 * run.parameter_elements));
}

TEST_P(ZeroEquivalence, CommunicationPerStepFollowsTheZeroFormulas) {
  const auto config = make_config(grad_accum(), zero_overrides(stage()));
  const DistributedRun run = train_distributed(config);
  const std::int64_t bytes = 4 * (run.parameter_elements + run.padding_bytes / 4);  // 4Ψ', fp32
  const std::int64_t groups = static_cast<std::int64_t>(run.buckets);
  const std::int64_t a = grad_accum();
  // Reduce-scatter: stage 1 once per step, stages 2–3 every micro-step.
  const std::int64_t reductions = stage() == 1 ? 1 : a;
  // All-gather: stages 1–2 the updated parameters once per step; stage 3 every unit
  // before its forward and again before its backward, every micro-step, but the root
  // unit (used last in forward, first in backward) only once per micro-step. Mutant
  // caught: end_forward releasing every unit (the root's bytes and one call more).
  const std::int64_t n = static_cast<std::int64_t>(run.metrics.front().comm.size());
  const std::int64_t gathered_bytes = stage() == 3 ? a * (2 * bytes - root_unit_bytes(config, n)) : bytes;
  const std::int64_t gather_calls = stage() == 3 ? a * (2 * groups - 1) : groups;
  for (const auto& m : run.metrics) {
    for (std::size_t r = 0; r < m.comm.size(); ++r) {
      const auto& c = m.comm[r];
      EXPECT_EQ(c[CommOp::kReduceScatter].bytes, reductions * bytes) << "rank " << r;
      EXPECT_EQ(c[CommOp::kReduceScatter].calls, reductions * groups) << "rank " << r;
      EXPECT_EQ(c[CommOp::kAllGather].bytes, gathered_bytes) << "rank " << r;
      EXPECT_EQ(c[CommOp::kAllGather].calls, gather_calls) << "rank " << r;
      // Which parameters have gradients is one all-reduce of a byte per parameter
      // (gradient_presence.h; none on one rank), and grad_clip = 1.0's global norm one
      // of a float64.
      const std::int64_t presence = n > 1 ? 1 : 0;
      EXPECT_EQ(c[CommOp::kAllReduce].calls, presence + 1) << "rank " << r;
      EXPECT_EQ(c[CommOp::kAllReduce].bytes,
                presence * static_cast<std::int64_t>(run.trajectory.params.size()) + 8)
          << "rank " << r;
      EXPECT_EQ(c[CommOp::kBroadcast].calls, 0) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages,
                         ZeroEquivalence,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return "stage_" + std::to_string(std::get<0>(info.param)) + "_grad_accum_" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(ZeroStage2, WithoutOverlapEveryReductionWaitsForTheEndOfBackwardAndStillMatches) {
  const auto config = make_config(2, zero_overrides(2, {"zero.overlap_comm=false"}));
  expect_equivalent(train_distributed(config).trajectory, train_reference(config), kFp32LossTolerance,
                    kFp32ParameterTolerance);
}

TEST(ZeroStage3, KeepingUnitsGatheredUntilBackwardHalvesTheGathers) {
  const DistributedRun run = train_distributed(make_config(1, zero_overrides(3, {"zero.reshard_after_forward=false"})));
  const std::int64_t bytes = 4 * (run.parameter_elements + run.padding_bytes / 4);
  for (const auto& m : run.metrics) {
    for (std::size_t r = 0; r < m.comm.size(); ++r) EXPECT_EQ(m.comm[r][CommOp::kAllGather].bytes, bytes);
  }
}

class ZeroBf16 : public ::testing::TestWithParam<int> {};

TEST_P(ZeroBf16, MatchesTheSameRecipeInOneProcess) {
  const auto config = make_config(1, zero_overrides(GetParam(), {"precision.dtype=\"bf16\""}));
  // As for data parallelism (runtime/dp_equivalence_test.cpp): the reference runs bf16
  // as the engine does, and the fp32 master shards are gathered and compared. Measured
  // worst (1 and 2 ranks, every stage): loss 8.8e-6 relative, parameters 2.7e-4 (a
  // norm summed in another order flips a bf16 rounding, which Adam carries); the mutant
  // without fp32 masters: 7.0e-4 and 1.65e-2.
  const DistributedRun run = train_distributed(config);
  expect_equivalent(run.trajectory, train_reference(config), 1e-4, 3e-3);
  // bf16 parameters (2 bytes) with fp32 masters and gradients: the gathers move 2Ψ'
  // (stage 3: twice, less the root unit kept from forward into backward).
  const std::int64_t padded = run.parameter_elements + run.padding_bytes / 4;
  const std::int64_t n = static_cast<std::int64_t>(run.metrics.front().comm.size());
  const std::int64_t gathered = GetParam() == 3 ? 2 * 2 * padded - root_unit_bytes(config, n) / 2 : 2 * padded;
  for (const auto& m : run.metrics) {
    EXPECT_EQ(m.comm[0][CommOp::kAllGather].bytes, gathered);
    EXPECT_EQ(m.comm[0][CommOp::kReduceScatter].bytes, 4 * padded);
    EXPECT_EQ(m.model_state_bytes[0].optimizer, 12 * padded / n);  // fp32 master + 2 moments
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroBf16, ::testing::Values(1, 2, 3), [](const auto& info) {
  return "stage_" + std::to_string(info.param);
});

}  // namespace
