// The MoE layer with its experts spread over the world (ep = world size: 2 or 4) against
// the same layer with every expert local in one process, in float64. One seed gives
// every rank the same layer, the same global batch and the same upstream weights; rank
// r takes sequences [r·B, (r+1)·B). Each rank's loss is its tokens' mean, as a
// data-parallel trainer's is, so the reductions are the engine's: the dense gate's
// gradient averaged over the token group (dp), each expert's summed over the ranks
// holding it (here one) and divided by the same dp size.
//
// What must hold, per configuration (top-1 / top-2, softmax / sigmoid, dropless /
// capacity): outputs, kept choices per expert and dropped counts equal the single
// process's; the gate's and every expert's gradients equal it to fp64 rounding (no
// routing tie is closer than 1e-9, checked, so no token can change experts); the
// all-to-all bytes equal the formula from the routing counts.
//
// Mutants these tests catch (each tried once):
//   - a token sent to the wrong rank (each rank's expert block shifted by one);
//   - the load-balancing loss's f_e counted over this rank's tokens only (the gate's
//     gradient differs);
//   - the capacity rule applied per rank (over all of its tokens) instead of per sequence.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "parallax/core/communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/expert_parallel/moe_layer.h"
#include "parallax/expert_parallel/routing.h"

namespace parallax::expert_parallel {
namespace {

// Largest gradient or output difference relative to the reference's largest magnitude,
// in float64. Measured: at most 7.9e-16 (ep = 2 and 4, every case here); the bound is
// about 10× that.
constexpr double kTolerance = 8e-15;

constexpr std::int64_t kHidden = 16, kFfn = 24, kExperts = 8, kSeq = 12, kBatchPerRank = 2;

struct Case {
  const char* name;
  std::int64_t top_k;
  RouterScore score;
  double capacity_factor;
};

class MoeLayerTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { world_ = create_mpi_world_communicator().release(); }
  static void TearDownTestSuite() {
    delete world_;
    world_ = nullptr;
  }
  static Communicator* world_;
};
Communicator* MoeLayerTest::world_ = nullptr;

double relative(const torch::Tensor& got, const torch::Tensor& want) {
  EXPECT_EQ(got.sizes(), want.sizes());
  const double scale = want.abs().max().item<double>();
  return (got - want).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

MoeOptions options_of(const Case& c) {
  return MoeOptions(kExperts, c.top_k)
      .score(c.score)
      .capacity_factor(c.capacity_factor)
      .aux_loss_coef(0.1)
      .z_loss_coef(0.01);
}

TEST_P(MoeLayerTest, SpreadExpertsMatchOneProcess) {
  const Case c = GetParam();
  Communicator& world = *world_;
  const int ranks = world.size();
  const int rank = world.rank();
  const std::int64_t batch = kBatchPerRank * ranks;
  torch::manual_seed(7);
  MoeLayer reference(kHidden, kFfn, options_of(c));
  reference->to(torch::kFloat64);
  torch::manual_seed(7);
  MoeLayer spread(kHidden, kFfn, options_of(c));
  spread->to(torch::kFloat64);
  spread->distribute(world, &world);
  ASSERT_EQ(spread->local_experts(), kExperts / ranks);
  ASSERT_EQ(spread->first_expert(), rank * kExperts / ranks);

  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({batch, kSeq, kHidden}, torch::kFloat64).requires_grad_(true);
  const torch::Tensor upstream = torch::randn({batch, kSeq, kHidden}, torch::kFloat64);

  // The guard against routing ties: every token's k-th score beats its (k+1)-th by 1e-9.
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = reference->gate(x);
    const torch::Tensor scores = c.score == RouterScore::kSoftmax ? torch::softmax(logits, -1) : torch::sigmoid(logits);
    const torch::Tensor top = std::get<0>(torch::topk(scores, c.top_k + 1, -1));
    const double gap = (top.select(-1, c.top_k - 1) - top.select(-1, c.top_k)).min().item<double>();
    ASSERT_GT(gap, 1e-9) << "a routing tie would make the comparison meaningless";
  }

  // One process: the whole batch, the loss its mean.
  const torch::Tensor whole = reference(x);
  (whole * upstream).sum().div(static_cast<double>(batch)).backward();
  const RoutingStats whole_stats = reference->take_stats();

  // Spread: this rank's sequences, its own mean.
  const torch::Tensor mine = x.narrow(0, rank * kBatchPerRank, kBatchPerRank).detach().requires_grad_(true);
  const CommCounters before = world.counters();
  const torch::Tensor out = spread(mine);
  const RoutingStats stats = spread->take_stats();
  const CommCounters forward = world.counters().since(before);
  (out * upstream.narrow(0, rank * kBatchPerRank, kBatchPerRank))
      .sum()
      .div(static_cast<double>(kBatchPerRank))
      .backward();
  const CommCounters both = world.counters().since(before);

  EXPECT_LT(relative(out, whole.narrow(0, rank * kBatchPerRank, kBatchPerRank)), kTolerance) << c.name;

  // Kept and dropped choices, summed over ranks, are the single process's.
  torch::Tensor counts = torch::tensor(stats.tokens_per_expert, torch::kInt64);
  torch::Tensor dropped = torch::full({1}, stats.dropped, torch::kInt64);
  world.all_reduce(counts)->wait();
  world.all_reduce(dropped)->wait();
  EXPECT_TRUE(torch::equal(counts, torch::tensor(whole_stats.tokens_per_expert, torch::kInt64))) << c.name;
  EXPECT_EQ(dropped.item<std::int64_t>(), whole_stats.dropped) << c.name;
  if (c.capacity_factor > 0) EXPECT_GT(whole_stats.dropped, 0) << c.name << ": the capacity must bind";

  // Gradients: the input's (each rank's loss is ranks × its share of the whole mean);
  // the gate averaged over the token group; each expert divided by its size.
  EXPECT_LT(relative(mine.grad() / ranks, x.grad().narrow(0, rank * kBatchPerRank, kBatchPerRank)), kTolerance)
      << c.name << ": input";
  torch::Tensor gate_grad = spread->gate->weight.grad().clone();
  world.all_reduce(gate_grad)->wait();
  EXPECT_LT(relative(gate_grad / ranks, reference->gate->weight.grad()), kTolerance) << c.name << ": gate";
  const auto reference_params = reference->named_parameters();
  for (const auto& item : spread->named_parameters()) {
    if (item.key().rfind("experts.", 0) != 0) continue;
    const torch::Tensor want = reference_params[item.key()].grad();
    EXPECT_LT(relative(item.value().grad() / ranks, want), kTolerance) << c.name << ": " << item.key();
  }

  // The all-to-all bytes from the routing counts: rank r's kept choices for experts
  // outside its block go out, other ranks' for its block come in, each a row of
  // kHidden doubles, forward and again backward; plus the E/P counts to every peer.
  torch::NoGradGuard no_grad;
  const Routing whole_routing = route(reference->gate(x), options_of(c), nullptr);
  const torch::Tensor owner = torch::div(whole_routing.expert, kExperts / ranks, "floor");
  const torch::Tensor source =
      torch::div(torch::arange(batch * kSeq), kBatchPerRank * kSeq, "floor").unsqueeze(1).expand_as(owner);
  const torch::Tensor kept = whole_routing.kept;
  const std::int64_t rows_out = (kept & (source == rank) & (owner != rank)).sum().item<std::int64_t>();
  const std::int64_t rows_in = (kept & (source != rank) & (owner == rank)).sum().item<std::int64_t>();
  const std::int64_t row_bytes = kHidden * 8;
  const std::int64_t count_bytes = (ranks - 1) * (kExperts / ranks) * 8;
  EXPECT_EQ(forward[CommOp::kAllToAll].bytes, (rows_out + rows_in) * row_bytes + count_bytes) << c.name;
  EXPECT_EQ(forward[CommOp::kAllToAll].calls, 3) << c.name << ": counts, rows out, rows back";
  EXPECT_EQ(stats.exchange_bytes, forward[CommOp::kAllToAll].bytes) << c.name;
  EXPECT_EQ(both[CommOp::kAllToAll].bytes, 2 * (rows_out + rows_in) * row_bytes + count_bytes) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Routings,
                         MoeLayerTest,
                         ::testing::Values(Case{"top1_dropless", 1, RouterScore::kSoftmax, 0.0},
                                           Case{"top2_dropless", 2, RouterScore::kSoftmax, 0.0},
                                           Case{"top2_sigmoid", 2, RouterScore::kSigmoid, 0.0},
                                           Case{"top1_capacity", 1, RouterScore::kSoftmax, 1.0},
                                           Case{"top2_capacity", 2, RouterScore::kSoftmax, 0.75}),
                         [](const auto& info) { return std::string(info.param.name); });

// The auxiliary losses join backward through the output, weighted by the engine's
// scale: the gate's gradient equals that of a layer without them plus the losses written
// out here from the routing's definition (moe_options.h). Mutants caught: the carried
// loss's gradient left out (or not scaled), f_e counted after dropping.
TEST(MoeLayer, TheAuxiliaryLossesJoinBackwardThroughTheOutput) {
  const double balance_coef = 0.3, z_coef = 0.05, scale = 0.25;
  const MoeOptions with = MoeOptions(kExperts, 2).capacity_factor(0.75).aux_loss_coef(balance_coef).z_loss_coef(z_coef);
  const MoeOptions without = MoeOptions(kExperts, 2).capacity_factor(0.75).aux_loss_coef(0).z_loss_coef(0);
  torch::manual_seed(3);
  MoeLayer carried(kHidden, kFfn, with);
  torch::manual_seed(3);
  MoeLayer written(kHidden, kFfn, without);
  carried->to(torch::kFloat64);
  written->to(torch::kFloat64);
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({2, kSeq, kHidden}, torch::kFloat64);
  const torch::Tensor upstream = torch::randn({2, kSeq, kHidden}, torch::kFloat64);
  {
    const AuxLossGradientScale weight(scale);
    (carried(x) * upstream).sum().mul(scale).backward();
  }
  // The losses by their definitions, on the same logits.
  const torch::Tensor logits = written->gate(x).reshape({-1, kExperts});
  const torch::Tensor probability = torch::softmax(logits, -1);
  const torch::Tensor chosen = std::get<1>(torch::topk(probability, 2, -1));
  const torch::Tensor fraction =
      torch::bincount(chosen.reshape({-1}), {}, kExperts).to(torch::kFloat64) / static_cast<double>(chosen.numel());
  const torch::Tensor balance = kExperts * (fraction * probability.mean(0)).sum();
  const torch::Tensor z = torch::logsumexp(logits, -1).pow(2).mean();
  ((written(x) * upstream).sum() + balance_coef * balance + z_coef * z).mul(scale).backward();
  EXPECT_LT(relative(carried->gate->weight.grad(), written->gate->weight.grad()), kTolerance);
  const RoutingStats stats = carried->take_stats();
  EXPECT_NEAR(stats.balance_loss, balance.item<double>(), 1e-12);
  EXPECT_NEAR(stats.z_loss, z.item<double>(), 1e-12);
  EXPECT_GT(stats.dropped, 0) << "capacity 0.75 must drop";
}

TEST(MoeLayer, ExpertsThatDoNotDivideOverTheGroupAreRefusedByName) {
  auto world = create_mpi_world_communicator();
  if (world->size() < 2) GTEST_SKIP();
  MoeLayer layer(4, 8, MoeOptions(world->size() + 1, 1));
  try {
    layer->distribute(*world, world.get());
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("n_experts = " + std::to_string(world->size() + 1)), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace parallax::expert_parallel
