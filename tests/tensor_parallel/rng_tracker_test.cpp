// Dropout under tensor parallelism: identical across the group where activations are
// replicated, different per rank where they are sharded, the same in a second run, and
// the same again when a region is recomputed from a captured state.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/tensor_parallel/rng_tracker.h"

namespace {

using parallax::tensor_parallel::RngTracker;

constexpr std::int64_t kSeed = 1234;
constexpr std::int64_t kElements = 4096;

// Every rank's `mask`, stacked [ranks, kElements].
torch::Tensor from_every_rank(parallax::Communicator& group, const torch::Tensor& mask) {
  torch::Tensor all = torch::empty({group.size() * kElements}, mask.options());
  group.all_gather(all, mask.contiguous())->wait();
  return all.view({group.size(), kElements});
}

torch::Tensor dropout_mask() {
  return torch::dropout(torch::ones({kElements}), 0.5, /*train=*/true);
}

TEST(RngTracker, ReplicatedDropoutAgreesShardedDiffersAndForkLeavesTheDefaultStreamAlone) {
  auto group = parallax::create_mpi_world_communicator();
  torch::manual_seed(kSeed);
  RngTracker rng;
  rng.add("tensor-parallel", kSeed + 2718 + group->rank());

  const torch::Tensor replicated = dropout_mask();
  torch::Tensor sharded;
  {
    auto fork = rng.fork("tensor-parallel");
    sharded = dropout_mask();
  }
  const torch::Tensor after = dropout_mask();

  const torch::Tensor replicated_all = from_every_rank(*group, replicated);
  const torch::Tensor sharded_all = from_every_rank(*group, sharded);
  const torch::Tensor after_all = from_every_rank(*group, after);
  for (int r = 1; r < group->size(); ++r) {
    EXPECT_TRUE(torch::equal(replicated_all[r], replicated_all[0])) << "replicated region, rank " << r;
    EXPECT_FALSE(torch::equal(sharded_all[r], sharded_all[0])) << "sharded region, rank " << r;
    EXPECT_TRUE(torch::equal(after_all[r], after_all[0])) << "after the fork, rank " << r;
  }
  // The fork drew from its own stream: the default one continues as if it had not run.
  torch::manual_seed(kSeed);
  dropout_mask();
  EXPECT_TRUE(torch::equal(dropout_mask(), after));

  // A second run from the same seeds draws the same sharded mask.
  RngTracker again;
  again.add("tensor-parallel", kSeed + 2718 + group->rank());
  auto fork = again.fork("tensor-parallel");
  EXPECT_TRUE(torch::equal(dropout_mask(), sharded));
}

TEST(RngTracker, RecomputationFromACapturedStateDrawsTheSameMasks) {
  torch::manual_seed(kSeed);
  RngTracker rng;
  rng.add("tensor-parallel", 99);
  auto region = [&rng] {
    const torch::Tensor replicated = dropout_mask();
    auto fork = rng.fork("tensor-parallel");
    return torch::stack({replicated, dropout_mask()});
  };
  const RngTracker::Snapshot before = rng.capture();
  const torch::Tensor first = region();
  rng.restore(before);
  EXPECT_TRUE(torch::equal(region(), first));
  EXPECT_THROW(rng.fork("no-such-stream"), parallax::UsageError);
  EXPECT_THROW(rng.add("tensor-parallel", 1), parallax::UsageError);
}

}  // namespace
