// Expert parallelism (parallel.ep) against the single-process reference: the GPT example
// with mixture-of-experts blocks, every expert local in one process, trained by the engine
// with each MoE layer's experts shared out over ep ranks. Per-step losses and every
// parameter this rank holds (experts by their global index) must match the reference
// within the fp32 bounds, and each rank's model state must equal ZeRO's formulas with
// experts sharded over their own group, for ep = the world (every rank holds other
// experts), ep inside dp (experts replicated over dp × cp / ep ranks), ZeRO 1–3, offloaded
// expert optimizer
// state, dropless and capacity routing, top-1 and top-2, softmax and sigmoid routers,
// context parallelism, pipeline stages and tensor parallelism (experts split over tp).
//
// Mutants these tests catch (each tried once):
//   - expert gradients averaged over the ranks holding them instead of the whole
//     data-parallel group (scaled by ep: the bug most reported against MoE trainers);
//   - expert gradients reduced over the data-parallel group (summing other experts);
//   - the clipping norm without the experts (their weight 0 in the replicated norm, their
//     flat groups left out of ZeRO's): caught where clipping binds every step.
//   - the experts' ZeRO flat groups sharded over dp × cp instead of the ranks holding
//     them (the held bytes differ from the formula);
//   - dense parameters counted ep times in the replicated norm (their weight not divided
//     by ep): caught where clipping binds, with and without tp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mpi.h>
#include <map>

#include "gpt.h"
#include "gpt_training.h"
#include "parallax/core/config.h"
#include "parallax/expert_parallel/moe_layer.h"
#include "parallax/planner/model_state.h"
#include "parallax/runtime/parallax.h"
#include "pipeline_training.h"

namespace {

using equivalence::kFp32LossTolerance;
using equivalence::kFp32ParameterTolerance;

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// The MoE blocks: 4 experts of d_ff 128 in every block, top-2, dropless, with the
// load-balancing and z losses on; `extra` adds or overrides.
parallax::Config moe_config(std::vector<std::string> extra) {
  std::vector<std::string> overrides = {"model.n_experts=4", "model.top_k=2", "model.aux_loss_coef=0.05",
                                        "model.z_loss_coef=0.001"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return equivalence::make_config(1, overrides);
}

// The MoE blocks' tensor-parallel plan: attention as configs/tp.toml splits it, each
// expert's fc1 by columns and fc2 by rows (the expert-tensor degree is tp), the router
// replicated.
const std::string kMoePlan =
    "tensor_parallel.plan={\"token_embedding\"=\"vocab_embedding\", \"position_embedding\"=\"replicate\", "
    "\"blocks.*.qkv\"={style=\"column\", parts=3, heads=4}, \"blocks.*.attn_proj\"={style=\"row\", heads=4}, "
    "\"blocks.*.moe.gate\"=\"replicate\", \"blocks.*.moe.experts.*.fc1\"=\"column\", "
    "\"blocks.*.moe.experts.*.fc2\"=\"row\", \"head\"=\"vocab_output\"}";

// Trains `config` both ways and compares every parameter this rank holds, by name (its
// tensor-parallel part of it when tp > 1).
void expect_matches_reference(const parallax::Config& config, const std::string& label) {
  SCOPED_TRACE(label);
  const equivalence::Trajectory want = equivalence::train_reference(config);
  const equivalence::DistributedRun got = equivalence::train_distributed(config);
  const auto options = gpt::GPTOptions::from_table(config.app_table("model"));
  gpt::GPT names_of(options, static_cast<std::uint64_t>(config.train.seed));
  std::map<std::string, torch::Tensor> reference;
  std::size_t index = 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int tp = config.parallel.tp;
  for (const auto& item : names_of->named_parameters()) {
    reference[item.key()] = equivalence::planned_part(item.key(), want.params.at(index++), rank % tp, tp);
  }

  const double worst_loss =
      equivalence::expect_losses_match(got.trajectory.losses, want.losses, kFp32LossTolerance, "expert parallel");
  ASSERT_EQ(got.names.size(), got.trajectory.params.size());
  double worst_param = 0.0;
  std::size_t experts_here = 0;
  for (std::size_t i = 0; i < got.names.size(); ++i) {
    const std::string& name = got.names[i];
    ASSERT_TRUE(reference.count(name)) << name;
    if (name.find(".moe.experts.") != std::string::npos) ++experts_here;
    const double diff = (got.trajectory.params[i] - reference.at(name)).abs().max().item<double>();
    worst_param = std::max(worst_param, diff);
    EXPECT_LE(diff, kFp32ParameterTolerance) << name;
  }
  // Each rank holds its block of each layer's experts: 4 parameters per expert.
  const int ep = config.parallel.ep;
  EXPECT_EQ(experts_here, static_cast<std::size_t>(2 * 4 * (options.n_experts / ep))) << "ep = " << ep;
  // Model state by ZeRO's formulas: dense parameters over dp × cp, experts over the
  // dp × cp / ep ranks holding them.
  if (config.offload.optimizer == parallax::OffloadTarget::kNone) {
    const int replicas = world_size() / (config.parallel.tp * config.parallel.pp);
    const parallax::ModelStateBytes formula = parallax::model_state_formula(
        got.gradient_bytes / 4, got.padding_bytes / 4, replicas, got.expert_gradient_bytes / 4,
        got.expert_padding_bytes / 4, replicas / ep, config.zero.stage, config.precision.dtype,
        parallax::optimizer_bytes_per_element(config.optimizer));
    EXPECT_EQ(got.expert_gradient_bytes > 0, ep > 1);
    EXPECT_EQ(got.held.params, formula.params);
    EXPECT_EQ(got.held.grads, formula.grads);
    EXPECT_EQ(got.held.optimizer, formula.optimizer);
  }
  std::printf("[ figures  ] %s: worst loss %.3g, worst parameter %.3g\n", label.c_str(), worst_loss, worst_param);
}

TEST(ExpertParallel, EveryRankHoldsOtherExpertsAtEveryZeroStage) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  const std::string ep = "parallel.ep=" + std::to_string(world_size());
  for (int stage : {0, 1, 2, 3}) {
    expect_matches_reference(moe_config({ep, "zero.stage=" + std::to_string(stage)}),
                             "ep " + std::to_string(world_size()) + ", zero " + std::to_string(stage));
  }
}

TEST(ExpertParallel, CapacityTopOneAndSigmoidRouting) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  const std::string ep = "parallel.ep=" + std::to_string(world_size());
  // Capacity 1.0 of top-1 over 4 experts drops a share of every sequence's tokens.
  expect_matches_reference(moe_config({ep, "model.top_k=1", "model.capacity_factor=1.0"}), "capacity, top-1");
  expect_matches_reference(moe_config({ep, "model.router=\"sigmoid\"", "model.capacity_factor=1.5", "zero.stage=1"}),
                           "sigmoid, top-2, capacity 1.5");
}

// Losses whose gradients matter and a clipping bound every step meets: the auxiliary
// losses' gradients must reach the gate, and the norm must count every expert once.
TEST(ExpertParallel, AuxiliaryLossesAndClippingCountEveryExpert) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  const std::string ep = "parallel.ep=" + std::to_string(world_size());
  for (int stage : {0, 2}) {
    expect_matches_reference(moe_config({ep, "zero.stage=" + std::to_string(stage), "model.aux_loss_coef=1.0",
                                         "model.z_loss_coef=0.1", "optimizer.grad_clip=0.05"}),
                             "strong auxiliary losses, clip 0.05, zero " + std::to_string(stage));
  }
}

TEST(ExpertParallel, ExpertsReplicatedOverPartOfTheDataParallelGroup) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  if (world_size() < 4) {
    // ep = 1: every expert on every rank; the load-balancing loss still counts the whole batch.
    expect_matches_reference(moe_config({"parallel.ep=1"}), "ep 1 over dp 2");
    return;
  }
  expect_matches_reference(moe_config({"parallel.ep=2"}), "ep 2 inside dp 4, zero 0");
  expect_matches_reference(moe_config({"parallel.ep=2", "zero.stage=2"}), "ep 2 inside dp 4, zero 2");
  // Stage 3: each block's dense parameters and its experts are two gather units, sharded
  // over dp and over the ranks holding the experts.
  expect_matches_reference(moe_config({"parallel.ep=2", "zero.stage=3"}), "ep 2 inside dp 4, zero 3");
}

// ep × tp: each expert split over the tensor-parallel group by the plan (fc1 by columns,
// fc2 by rows: the expert-tensor degree is tp), the router replicated, every tp rank
// routing the same tokens over its own ep group. A clipping bound every step meets holds
// the norm to counting each part once.
TEST(ExpertParallel, ExpertsSplitOverTensorParallelism) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  if (world_size() < 4) GTEST_SKIP() << "tp 2 × dp 2 needs 4 ranks";
  for (int stage : {0, 1}) {
    expect_matches_reference(moe_config({"parallel.tp=2", "parallel.ep=2", kMoePlan, "optimizer.grad_clip=0.05",
                                         "zero.stage=" + std::to_string(stage)}),
                             "tp 2 x dp 2, ep 2, experts split over tp, zero " + std::to_string(stage));
  }
}

TEST(ExpertParallel, OffloadedExpertOptimizerState) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  expect_matches_reference(moe_config({"parallel.ep=2", "zero.stage=2", "offload.optimizer=\"cpu\""}),
                           "ep 2, zero 2, optimizer offloaded");
}

TEST(ExpertParallel, WithContextParallelism) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  // cp 2 (dp = world / 2): ep 2 folds over the cp ranks (and dp at 4 ranks).
  expect_matches_reference(moe_config({"parallel.cp=2", "parallel.ep=2"}), "cp 2, ep 2");
}

// Each step's routing metrics (StepMetrics::moe) are what one process's layers routed on
// the same global batch: the dropped fraction and the worst layer's imbalance exactly (the
// same tokens took the same experts), the auxiliary loss to fp32 rounding; and each rank's
// all-to-all bytes are what its layers' dispatches counted. Mutants caught: the
// imbalance taken over this rank's tokens (not summed over the replicas); the ep group's
// counters left out of the step's (all_to_all bytes 0).
TEST(ExpertParallel, RoutingMetricsAreTheSingleProcessRouting) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  const parallax::Config config =
      moe_config({"parallel.ep=" + std::to_string(world_size()), "model.top_k=2", "model.capacity_factor=1.0"});
  // One process, as train_reference trains, reading its layers' routing after each step.
  const auto options = gpt::GPTOptions::from_table(config.app_table("model"));
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, config.train.seed);
  gpt::GPT model(options, static_cast<std::uint64_t>(config.train.seed));
  const auto spec = parallax::OptimizerSpec::from(config);
  auto optimizer = equivalence::reference_optimizer(config, *model, model->parameters());
  const auto layers = parallax::expert_parallel::moe_layers(*model);
  ASSERT_EQ(layers.size(), 2u);
  std::vector<parallax::RoutingMetrics> want;
  for (std::int64_t step = 0; step < equivalence::kSteps; ++step) {
    auto [inputs, targets] = data.batch(step * equivalence::kGlobalBatch, equivalence::kGlobalBatch);
    auto loss = gpt::language_model_loss(model->forward(inputs), targets);
    optimizer->zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), spec.optimizer.grad_clip);
    parallax::set_learning_rate(*optimizer, parallax::scheduled_lr(spec, step));
    optimizer->step();
    parallax::RoutingMetrics m;
    double choices = 0, dropped = 0;
    for (auto* layer : layers) {
      const auto stats = layer->take_stats();
      m.aux_loss +=
          (layer->options().aux_loss_coef() * stats.balance_loss + layer->options().z_loss_coef() * stats.z_loss) /
          layers.size();
      m.imbalance = std::max(m.imbalance, stats.imbalance());
      choices += stats.choices;
      dropped += stats.dropped;
    }
    m.dropped_fraction = dropped / choices;
    want.push_back(m);
  }
  const equivalence::DistributedRun got = equivalence::train_distributed(config);
  ASSERT_EQ(got.metrics.size(), want.size());
  for (std::size_t s = 0; s < want.size(); ++s) {
    const parallax::RoutingMetrics& m = got.metrics[s].moe;
    EXPECT_EQ(m.layers, 2) << "step " << s + 1;
    EXPECT_DOUBLE_EQ(m.dropped_fraction, want[s].dropped_fraction) << "step " << s + 1;
    EXPECT_DOUBLE_EQ(m.imbalance, want[s].imbalance) << "step " << s + 1;
    EXPECT_NEAR(m.aux_loss, want[s].aux_loss, 1e-6 * want[s].aux_loss) << "step " << s + 1;
    for (const parallax::CommCounters& rank : got.metrics[s].comm)
      EXPECT_GT(rank[parallax::CommOp::kAllToAll].bytes, 0);
  }
  EXPECT_GT(want.front().dropped_fraction, 0.0) << "capacity 1.0 must drop";
  for (std::size_t s : {std::size_t{0}, want.size() - 1}) {
    const parallax::StepMetrics& m = got.metrics[s];
    std::printf(
        "[ figures  ] ep %d, top-2, capacity 1.0, step %lld: aux loss %.5f (balance %.4f), imbalance %.3f, "
        "dropped %.2f%%, all-to-all %.1f KiB sent by rank 0\n",
        world_size(), static_cast<long long>(m.step), m.moe.aux_loss, m.moe.balance_loss, m.moe.imbalance,
        100 * m.moe.dropped_fraction, m.comm[0][parallax::CommOp::kAllToAll].bytes / 1024.0);
  }
}

TEST(ExpertParallel, WithPipelineStages) {
  if (world_size() > 4) GTEST_SKIP() << "8 ranks run ExpertParallelEightRanks";
  if (world_size() < 4) GTEST_SKIP() << "pp 2 × dp 2 needs 4 ranks";
  // Four micro-batches: the load-balancing loss counts each micro-batch's choices, where the
  // reference (one forward of the global batch) counts the batch's, so it is off here; the
  // z-loss, a per-token mean, agrees.
  for (int stage : {0, 3}) {
    const parallax::Config config = moe_config({"parallel.pp=2", "parallel.ep=2", "train.grad_accum=4",
                                                "model.aux_loss_coef=0", "zero.stage=" + std::to_string(stage)});
    equivalence::expect_pipeline_matches_reference(config, "pp 2 x dp 2, ep 2, zero " + std::to_string(stage));
  }
}

// Eight ranks: the largest layouts here, 8 experts, each of three axes at once.
TEST(ExpertParallelEightRanks, ThreeAxesTogether) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  expect_matches_reference(moe_config({"model.n_experts=8", "parallel.ep=4", "zero.stage=3"}),
                           "dp 8, ep 4 (experts over 2 ranks each), zero 3");
  expect_matches_reference(
      moe_config({"model.n_experts=8", "parallel.tp=2", "parallel.ep=4", kMoePlan, "zero.stage=1"}),
      "tp 2 x dp 4, ep 4, experts split over tp, zero 1");
  expect_matches_reference(moe_config({"model.n_experts=8", "parallel.cp=2", "parallel.ep=4", "zero.stage=2"}),
                           "cp 2 x dp 4, ep 4, zero 2");
}

}  // namespace
