// Tensor parallelism computes what one process computes: the GPT example split by
// configs/tp.toml's plan and trained by the engine on every rank of the world (tp = 2
// and 4, and tp = 2 × dp = 2 on 4 ranks; with and without sequence parallelism), against
// a single-process LibTorch run of the same global batch. Each rank's final parameters
// are compared with its part of the reference's; replicated parameters must also stay
// bit-identical across the tensor-parallel group.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>

#include "gpt.h"
#include "gpt_training.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/runtime/parallax.h"

namespace {

using namespace equivalence;

// (tp, sequence parallel, grad_accum)
class TpEquivalence : public ::testing::TestWithParam<std::tuple<int, bool, std::int64_t>> {
 protected:
  int tp() const { return std::get<0>(GetParam()); }
  bool sequence_parallel() const { return std::get<1>(GetParam()); }
  std::int64_t grad_accum() const { return std::get<2>(GetParam()); }

  parallax::Config config() const {
    auto c = make_config(grad_accum(),
                         {"parallel.tp=" + std::to_string(tp()),
                          std::string("tensor_parallel.sequence_parallel=") + (sequence_parallel() ? "true" : "false")},
                         "tp.toml");
    return c;
  }
};

TEST_P(TpEquivalence, MatchesSingleProcessFp32) {
  const auto world = parallax::create_mpi_world_communicator();
  if (world->size() % tp() != 0) GTEST_SKIP() << "tp = " << tp() << " does not divide " << world->size() << " ranks";
  const auto c = config();
  const Trajectory reference = train_reference(c);
  const DistributedRun run = train_distributed(c);

  // Each rank holds its part of every split parameter.
  const auto options = gpt::GPTOptions::from_table(c.app_table("model"));
  const gpt::GPT names(options);
  const int tp_rank = world->rank() % tp();  // the plain layout on one node: tp innermost
  Trajectory want = reference;
  std::vector<torch::Tensor> replicated;
  std::size_t i = 0;
  for (const auto& p : names->named_parameters()) {
    want.params[i] = planned_part(p.key(), reference.params[i], tp_rank, tp());
    if (want.params[i].numel() == reference.params[i].numel()) replicated.push_back(run.trajectory.params[i].flatten());
    ++i;
  }
  expect_equivalent(run.trajectory, want, 1e-5, 1e-5);

  // Replicated parameters (LayerNorms, row biases, the position embedding) are the same
  // bits on every rank of a tensor-parallel group.
  const torch::Tensor mine = torch::cat(replicated);
  torch::Tensor all = torch::empty({world->size(), mine.numel()});
  world->all_gather(all, mine)->wait();
  for (int r = 0; r < world->size(); ++r) {
    EXPECT_TRUE(torch::equal(all[r], all[r - r % tp()])) << "rank " << r << " vs rank " << r - r % tp();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts,
                         TpEquivalence,
                         ::testing::Values(std::make_tuple(2, false, 1),
                                           std::make_tuple(2, true, 1),
                                           std::make_tuple(2, false, 2),
                                           std::make_tuple(4, false, 1),
                                           std::make_tuple(4, true, 2)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sp" : "") + "_ga" +
                                  std::to_string(std::get<2>(info.param));
                         });

}  // namespace
