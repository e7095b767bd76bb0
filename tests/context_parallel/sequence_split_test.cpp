// SequenceSplit: the positions each rank holds, their inverse, and the causal work they
// give each rank.
#include "parallax/context_parallel/sequence_split.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "parallax/core/error.h"

namespace parallax::context_parallel {
namespace {

std::vector<std::int64_t> as_vector(const torch::Tensor& t) {
  return {t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel()};
}

TEST(SequenceSplit, BalancedRanksHoldOneEarlyAndOneLateChunk) {
  SequenceSplit split(16, 4);
  EXPECT_EQ(split.chunk_len(), 2);
  EXPECT_EQ(split.local_len(), 4);
  EXPECT_EQ(as_vector(split.positions(0)), (std::vector<std::int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(as_vector(split.positions(1)), (std::vector<std::int64_t>{2, 3, 12, 13}));
  EXPECT_EQ(as_vector(split.positions(3)), (std::vector<std::int64_t>{6, 7, 8, 9}));
  // Equal causal work: 2·cp + 1 chunk pairs on every rank.
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(split.causal_chunk_pairs(rank), 9);
}

TEST(SequenceSplit, ContiguousRanksHoldTheirRangeAndTheLastWorksHardest) {
  SequenceSplit split(16, 4, /*load_balance=*/false);
  EXPECT_EQ(as_vector(split.positions(1)), (std::vector<std::int64_t>{4, 5, 6, 7}));
  std::int64_t total = 0;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(split.causal_chunk_pairs(rank), 4 * rank + 3);
    total += split.causal_chunk_pairs(rank);
  }
  // The last rank does (4·cp − 1)/(2·cp + 1) = 15/9 of the mean.
  EXPECT_EQ(split.causal_chunk_pairs(3) * 4, 15 * total / 9);
}

TEST(SequenceSplit, PartsJoinBackToTheWhole) {
  for (bool balanced : {true, false}) {
    SequenceSplit split(24, 3, balanced);
    const torch::Tensor whole = torch::arange(2 * 24 * 5, torch::kFloat).reshape({2, 24, 5});
    std::vector<torch::Tensor> parts;
    for (int rank = 0; rank < 3; ++rank) {
      parts.push_back(split.local_part(whole, rank, 1));
      EXPECT_TRUE(torch::equal(parts.back().select(2, 0).select(0, 0), split.positions(rank).to(torch::kFloat) * 5));
    }
    EXPECT_TRUE(torch::equal(split.whole_from_parts(parts, 1), whole));
  }
}

TEST(SequenceSplit, LengthsThatDoNotSplitAreRefusedWithTheNearestThatDo) {
  try {
    SequenceSplit(100, 4);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    const std::string what = error.what();
    for (const char* part : {"100 positions", "cp = 4", "multiple of 8", "96 or 104"}) {
      EXPECT_NE(what.find(part), std::string::npos) << part << " missing in: " << what;
    }
  }
  EXPECT_THROW(SequenceSplit(16, 0), ConfigError);
  SequenceSplit split(16, 2);
  EXPECT_THROW(split.positions(2), UsageError);
  EXPECT_THROW(split.local_part(torch::zeros({15}), 0, 0), UsageError);
}

}  // namespace
}  // namespace parallax::context_parallel
