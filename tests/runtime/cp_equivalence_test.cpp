// Context parallelism computes what one process computes: the GPT example trained with
// each sequence split over cp ranks (alone, and times dp) must match a plain
// single-process LibTorch run of the same global batch, step by step (losses) and at the
// end (parameters), for ring and all-to-all attention, balanced and contiguous splits,
// every ZeRO stage with and without the optimizer offloaded, and cp × tp with and
// without sequence parallelism (cp inside pipeline stages: matrix_equivalence_test).
//
// Mutants these tests catch (each tried once):
//   - gradients reduced over dp only instead of dp × cp: each cp rank steps with its own
//     positions' gradient, and the replicas drift apart;
//   - positions embedded as 0..S/cp-1 on every rank instead of the split's global ones;
//   - the batch split along the sequence with the contiguous chunks while attention
//     assumes the balanced ones: the causal mask lets queries see future keys.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "gpt_training.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/runtime/parallax.h"

namespace {

using namespace equivalence;

struct Cell {
  std::string name;
  std::vector<std::string> overrides;
};
void PrintTo(const Cell& cell, std::ostream* out) {
  *out << cell.name;
}

class ContextParallelEquivalence : public ::testing::TestWithParam<Cell> {};

// cp = the world size (dp = 1), and cp = 2 × dp = world / 2 where the world allows.
TEST_P(ContextParallelEquivalence, MatchesSingleProcessFp32) {
  const int world = parallax::create_mpi_world_communicator()->size();
  std::vector<int> cps{world};
  if (world >= 4) cps.push_back(2);
  for (int cp : cps) {
    SCOPED_TRACE("cp = " + std::to_string(cp) + ", dp = " + std::to_string(world / cp));
    std::vector<std::string> overrides = GetParam().overrides;
    overrides.push_back("parallel.cp=" + std::to_string(cp));
    const auto config = make_config(1, overrides);
    const Trajectory reference = train_reference(config);
    const DistributedRun run = train_distributed(config);
    expect_equivalent(run.trajectory, reference, kFp32LossTolerance, kFp32ParameterTolerance);
    EXPECT_LT(reference.losses.back(), reference.losses.front());
  }
}

INSTANTIATE_TEST_SUITE_P(Cells,
                         ContextParallelEquivalence,
                         ::testing::Values(Cell{"ring", {}},
                                           Cell{"ring_contiguous", {"context_parallel.load_balance=false"}},
                                           Cell{"all_to_all", {"context_parallel.method=\"all_to_all\""}},
                                           Cell{"ring_zero1", {"zero.stage=1"}},
                                           Cell{"ring_zero2", {"zero.stage=2"}},
                                           Cell{"ring_zero3", {"zero.stage=3"}},
                                           Cell{"all_to_all_zero3_offload",
                                                {"context_parallel.method=\"all_to_all\"", "zero.stage=3",
                                                 "offload.optimizer=\"cpu\""}},
                                           Cell{"ring_zero2_offload", {"zero.stage=2", "offload.optimizer=\"cpu\""}}),
                         [](const ::testing::TestParamInfo<Cell>& info) { return info.param.name; });

// The step metrics count context parallelism's traffic and the gradient reduction over
// dp × cp, exactly: with the ring at cp = the world (dp 1, ZeRO 0), every rank sends per
// step and attention layer (4(cp − 1) + 2cp)·B, B the bytes of its K (docs/context-
// parallelism.md's table), and all-reduces the gradient bytes once. Mutant caught (tried
// once): the telemetry counting the dp, tp, pp and world groups only (no send, no
// all-reduce in the metrics).
TEST(ContextParallelMetrics, EveryStepCountsTheRingAndTheReductionOverTheReplicas) {
  const int cp = parallax::create_mpi_world_communicator()->size();
  const auto config = make_config(1, {"parallel.cp=" + std::to_string(cp)});
  const DistributedRun run = train_distributed(config);
  const std::int64_t layers = 2, d_model = 32;  // make_config's
  const std::int64_t block_size = config.app_table("model").get_int("block_size");
  const std::int64_t key_bytes = kGlobalBatch * (block_size / cp) * d_model * 4;
  for (const auto& m : run.metrics) {
    ASSERT_EQ(static_cast<int>(m.comm.size()), cp);
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(m.comm[r][parallax::CommOp::kSend].bytes, layers * (4 * (cp - 1) + 2 * cp) * key_bytes) << "rank " << r;
      EXPECT_EQ(m.comm[r][parallax::CommOp::kAllReduce].bytes, run.gradient_bytes + run.padding_bytes)
          << "rank " << r;
    }
  }
}

// cp × tp on 4 ranks: configs/tp.toml's plan splits each block's heads over tp, and each
// tensor-parallel rank's heads attend across its own cp group (the ranks of its tp
// coordinate); with sequence parallelism the tp group further splits this rank's part of
// the sequence between the blocks. Each rank's part of every parameter is compared.
class ContextTimesTensorParallel : public ::testing::TestWithParam<Cell> {};

TEST_P(ContextTimesTensorParallel, MatchesSingleProcessFp32) {
  const int world = parallax::create_mpi_world_communicator()->size();
  if (world != 4) GTEST_SKIP() << "cp 2 × tp 2";
  std::vector<std::string> overrides{"parallel.cp=2", "parallel.tp=2", "zero.wrap=[\"Block\"]"};
  overrides.insert(overrides.end(), GetParam().overrides.begin(), GetParam().overrides.end());
  expect_tp_matches_reference(make_config(1, overrides, "tp.toml"), 2);
}

INSTANTIATE_TEST_SUITE_P(
    Cells,
    ContextTimesTensorParallel,
    ::testing::Values(Cell{"ring", {}},
                      Cell{"ring_sp", {"tensor_parallel.sequence_parallel=true"}},
                      Cell{"all_to_all_sp_zero1", {"context_parallel.method=\"all_to_all\"",
                                                   "tensor_parallel.sequence_parallel=true", "zero.stage=1"}},
                      Cell{"ring_contiguous_zero3_offload",
                           {"context_parallel.load_balance=false", "zero.stage=3", "offload.optimizer=\"cpu\""}}),
    [](const ::testing::TestParamInfo<Cell>& info) { return info.param.name; });

// What the strategy matrix does not run yet is refused by name, with the nearest cell.
TEST(ContextParallelRefusals, CudaAndTheAutomaticModeAreRefusedWithTheNearestCell) {
  for (const std::string& other : {std::string("train.device=\"cuda\""), std::string("parallel.mode=\"auto\"")}) {
    parallax::Config config = make_config(1, {"parallel.cp=2", other});
    try {
      parallax::Runtime rt(std::move(config), {{"model", "data"}, /*print_summary=*/false});
      ADD_FAILURE() << other << " with cp = 2 was not refused";
    } catch (const parallax::ConfigError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("parallel.cp = 2"), std::string::npos) << what;
      EXPECT_NE(what.find("instead: "), std::string::npos) << what;
    }
  }
}

}  // namespace

