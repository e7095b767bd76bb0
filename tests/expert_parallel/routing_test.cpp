// The router on hand-made logits, in one process: which experts each token chooses,
// which choices the capacity rule keeps (every first choice before any second, earlier
// positions first, per sequence), and the auxiliary losses' values.
//
// Mutants these tests catch (each tried once):
//   - the capacity counted over the rank's tokens instead of per sequence (a second
//     sequence then loses its slots to the first);
//   - second choices ranked with first choices by position (position 0's second choice
//     takes a slot before position 1's first choice);
//   - the balance loss's f_e counted after dropping instead of over every choice.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallax/core/error.h"
#include "parallax/expert_parallel/routing.h"

namespace parallax::expert_parallel {
namespace {

// Logits that make token t of every sequence prefer expert first[t], then second[t].
torch::Tensor logits_choosing(const std::vector<int>& first,
                              const std::vector<int>& second,
                              std::int64_t batch,
                              std::int64_t n_experts) {
  const auto seq = static_cast<std::int64_t>(first.size());
  torch::Tensor logits = torch::zeros({batch, seq, n_experts}, torch::kFloat64);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      logits[b][t][first[t]] = 3.0;
      logits[b][t][second[t]] = 2.0;
    }
  }
  return logits;
}

TEST(Routing, TopKChoosesTheHighestScoresBestFirst) {
  const torch::Tensor logits = logits_choosing({2, 0, 1}, {1, 2, 0}, 1, 3);
  const Routing r = route(logits, MoeOptions(3, 2), nullptr);
  EXPECT_TRUE(torch::equal(r.expert, torch::tensor({2, 1, 0, 2, 1, 0}, torch::kInt64).view({3, 2})));
  EXPECT_TRUE(r.kept.all().item<bool>());
  EXPECT_EQ(r.dropped, 0);
  EXPECT_EQ(r.choices, 6);
  // Softmax weights as they are: e³ / (e³ + e² + 1) and e² / (...).
  const double norm = std::exp(3.0) + std::exp(2.0) + 1.0;
  EXPECT_NEAR(r.weight[0][0].item<double>(), std::exp(3.0) / norm, 1e-15);
  EXPECT_NEAR(r.weight[0][1].item<double>(), std::exp(2.0) / norm, 1e-15);
  // Normalised: they sum to 1.
  const Routing n = route(logits, MoeOptions(3, 2).normalize_weights(true), nullptr);
  EXPECT_NEAR(n.weight[0][0].item<double>(), std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-15);
  // Sigmoid: always normalised.
  const Routing s = route(logits, MoeOptions(3, 2).score(RouterScore::kSigmoid), nullptr);
  const double a = 1.0 / (1.0 + std::exp(-3.0)), b = 1.0 / (1.0 + std::exp(-2.0));
  EXPECT_NEAR(s.weight[0][0].item<double>(), a / (a + b), 1e-15);
}

TEST(Routing, CapacityKeepsFirstChoicesBeforeSecondsThenEarlierPositionsPerSequence) {
  // 4 positions, 2 experts, top-2, capacity_factor 0.5: capacity ceil(0.5·2·4/2) = 2
  // per expert per sequence. Positions 0 and 1 choose expert 0 first, 2 and 3 expert 1:
  // the four first choices take every slot, the second choices are all dropped.
  const std::vector<int> first = {0, 0, 1, 1}, second = {1, 1, 0, 0};
  const MoeOptions options = MoeOptions(2, 2).capacity_factor(0.5);
  EXPECT_EQ(expert_capacity(options, 4), 2);
  const Routing r = route(logits_choosing(first, second, /*batch=*/2, 2), options, nullptr);
  const torch::Tensor want = torch::tensor({true, false}, torch::kBool).repeat({8, 1});
  EXPECT_TRUE(torch::equal(r.kept, want)) << r.kept;
  EXPECT_EQ(r.dropped, 8);
  EXPECT_TRUE(torch::equal(r.tokens_per_expert, torch::tensor({4, 4}, torch::kInt64)));

  // Three positions choose expert 0 first: with capacity 2 the third (position 2) is
  // dropped, in each of the two sequences alike.
  const Routing crowded = route(logits_choosing({0, 0, 0, 1}, {1, 1, 1, 0}, 2, 2), options, nullptr);
  for (int b = 0; b < 2; ++b) {
    EXPECT_TRUE(crowded.kept[4 * b + 0][0].item<bool>());
    EXPECT_TRUE(crowded.kept[4 * b + 1][0].item<bool>());
    EXPECT_FALSE(crowded.kept[4 * b + 2][0].item<bool>()) << "sequence " << b;
    EXPECT_TRUE(crowded.kept[4 * b + 3][0].item<bool>());
    // Expert 1 has one slot left after position 3's first choice: position 0's second choice.
    EXPECT_TRUE(crowded.kept[4 * b + 0][1].item<bool>());
    EXPECT_FALSE(crowded.kept[4 * b + 1][1].item<bool>());
  }
}

TEST(Routing, TheBalanceLossIsOneWhenUniformAndCountsChoicesBeforeDropping) {
  // Equal logits: every P_e = 1/E; the choices split evenly, so E·Σ f_e·P_e = 1.
  const torch::Tensor even = torch::zeros({1, 4, 4}, torch::kFloat64);
  const torch::Tensor tie_broken = even + torch::eye(4, torch::kFloat64).unsqueeze(0) * 1e-3;
  const Routing r = route(tie_broken, MoeOptions(4, 1).aux_loss_coef(0.5), nullptr);
  EXPECT_NEAR(r.balance_loss, 1.0, 1e-3);
  EXPECT_NEAR(r.aux_loss.item<double>(), 0.5 * r.balance_loss, 1e-15);
  // Everything to expert 0: f_0 = 1, P_0 = softmax's share; dropping (capacity 1 of 4)
  // does not change f.
  const torch::Tensor one_sided = torch::zeros({1, 4, 4}, torch::kFloat64).index_fill(2, torch::tensor({0}), 2.0);
  const double p0 = std::exp(2.0) / (std::exp(2.0) + 3.0);
  const Routing all = route(one_sided, MoeOptions(4, 1).capacity_factor(1.0), nullptr);
  EXPECT_EQ(all.dropped, 3);
  EXPECT_NEAR(all.balance_loss, 4.0 * p0, 1e-12);
  // z-loss: logsumexp² per token.
  const double lse = std::log(std::exp(2.0) + 3.0);
  EXPECT_NEAR(all.z_loss, lse * lse, 1e-12);
}

TEST(Routing, BadOptionsAreRefusedByName) {
  const torch::Tensor logits = torch::zeros({1, 2, 4});
  EXPECT_THROW(route(logits, MoeOptions(4, 5), nullptr), UsageError);
  EXPECT_THROW(route(logits, MoeOptions(4, 1).capacity_factor(-1), nullptr), UsageError);
  try {
    route(logits, MoeOptions(8, 2), nullptr);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("n_experts = 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parallax::expert_parallel
