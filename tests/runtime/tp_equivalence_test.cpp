// Tensor parallelism computes what one process computes: the GPT example split by
// configs/tp.toml's plan and trained by the engine on every rank of the world (tp = 2
// and 4, and tp = 2 × dp = 2 on 4 ranks; with and without sequence parallelism), against
// a single-process LibTorch run of the same global batch. Each rank's final parameters
// are compared with its part of the reference's; replicated parameters must also stay
// bit-identical across the tensor-parallel group.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "dense_attention.h"
#include "figures.h"
#include "gpt.h"
#include "gpt_training.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/runtime/parallax.h"
#include "parallax/tensor_parallel/parallel_blocks.h"
#include "parallax/tensor_parallel/rng_tracker.h"

namespace {

using namespace equivalence;

// (tp, sequence parallel, grad_accum, ZeRO stage over the data-parallel ranks)
class TpEquivalence : public ::testing::TestWithParam<std::tuple<int, bool, std::int64_t, int>> {
 protected:
  int tp() const { return std::get<0>(GetParam()); }
  bool sequence_parallel() const { return std::get<1>(GetParam()); }
  std::int64_t grad_accum() const { return std::get<2>(GetParam()); }
  int zero_stage() const { return std::get<3>(GetParam()); }

  parallax::Config config() const {
    return make_config(grad_accum(),
                       {"parallel.tp=" + std::to_string(tp()),
                        std::string("tensor_parallel.sequence_parallel=") + (sequence_parallel() ? "true" : "false"),
                        "zero.stage=" + std::to_string(zero_stage()), "zero.wrap=[\"Block\"]"},
                       "tp.toml");
  }
};

TEST_P(TpEquivalence, MatchesSingleProcessFp32) {
  const auto world = parallax::create_mpi_world_communicator();
  if (world->size() % tp() != 0) GTEST_SKIP() << "tp = " << tp() << " does not divide " << world->size() << " ranks";
  expect_tp_matches_reference(config(), tp());
}

// Offload under tensor parallelism (tp 2 × dp 2 on 4 ranks): the optimizer's state, and
// at stage 3 the parameters, on the host or the NVMe tier, each rank's shard of its part.
TEST(TpOffload, MatchesSingleProcessFp32) {
  const auto world = parallax::create_mpi_world_communicator();
  if (world->size() != 4) GTEST_SKIP() << "tp 2 x dp 2";
  const auto nvme = std::filesystem::temp_directory_path() / ("parallax_tp_nvme_" + std::to_string(::getppid()));
  std::filesystem::create_directories(nvme);
  const std::vector<std::vector<std::string>> cells{
      {"zero.stage=2", "offload.optimizer=\"cpu\""},
      {"zero.stage=3", "offload.optimizer=\"cpu\"", "offload.param=\"cpu\"", "tensor_parallel.sequence_parallel=true"},
      {"zero.stage=3", "offload.optimizer=\"nvme\"", "offload.param=\"nvme\"",
       "offload.nvme_path=\"" + nvme.string() + "\""},
  };
  for (const auto& cell : cells) {
    std::vector<std::string> overrides{"parallel.tp=2", "zero.wrap=[\"Block\"]"};
    overrides.insert(overrides.end(), cell.begin(), cell.end());
    SCOPED_TRACE(cell.front() + " " + cell[1]);
    const DistributedRun run = expect_tp_matches_reference(make_config(1, overrides, "tp.toml"), 2);
    const parallax::ModelStateBytes& held = run.metrics.back().model_state_bytes.at(0);
    EXPECT_GT(held.host + held.nvme, 0) << "nothing was offloaded";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts,
                         TpEquivalence,
                         ::testing::Values(std::make_tuple(2, false, 1, 0),
                                           std::make_tuple(2, true, 1, 0),
                                           std::make_tuple(2, false, 2, 0),
                                           std::make_tuple(4, false, 1, 0),
                                           std::make_tuple(4, true, 2, 0),
                                           std::make_tuple(2, false, 1, 1),
                                           std::make_tuple(2, true, 2, 2),
                                           std::make_tuple(2, true, 1, 3),
                                           std::make_tuple(2, false, 2, 3)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sp" : "") + "_ga" +
                                  std::to_string(std::get<2>(info.param)) + "_zero" +
                                  std::to_string(std::get<3>(info.param));
                         });

// Dropout through the runtime's streams, on tp = 2: the default generator (replicated
// activations) draws the same mask on every rank; the split stream draws a different
// mask per tensor-parallel rank and the same one on data-parallel replicas of a rank;
// a second runtime from the same train.seed draws exactly the same masks, and so does
// the parallel attention's dropout.
struct Draws {
  torch::Tensor replicated, split, attention, attention_without_dropout;
};

Draws draw_with_runtime(const parallax::Config& config) {
  parallax::Runtime rt(config, {{"model", "data"}, /*print_summary=*/false});
  Draws draws;
  const torch::Tensor ones = torch::ones({256});
  draws.replicated = torch::dropout(ones, 0.5, true);
  {
    auto split = rt.rng_tracker().fork(parallax::tensor_parallel::kSplitStream);
    draws.split = torch::dropout(ones, 0.5, true);
  }
  torch::nn::Linear qkv(16, 48), proj(16, 16);  // same weights everywhere: seeded by the runtime
  parallax::tensor_parallel::ParallelCausalSelfAttention attention(qkv, proj, 4, rt.mesh().tp());
  attention->dropout_attention(0.5, rt.rng_tracker());
  const torch::Tensor x = torch::linspace(-1, 1, 2 * 6 * 16).view({2, 6, 16});
  draws.attention = attention(x).detach();
  attention->eval();
  draws.attention_without_dropout = attention(x).detach();
  return draws;
}

TEST(TpDropout, ReplicatedAgreeSplitDifferRunsRepeat) {
  const auto world = parallax::create_mpi_world_communicator();
  const auto config = make_config(1, {"parallel.tp=2"}, "tp.toml");
  const Draws first = draw_with_runtime(config);
  const Draws second = draw_with_runtime(config);
  EXPECT_TRUE(torch::equal(first.replicated, second.replicated));
  EXPECT_TRUE(torch::equal(first.split, second.split));
  EXPECT_TRUE(torch::equal(first.attention, second.attention));

  auto gathered = [&world](const torch::Tensor& mine) {
    torch::Tensor all = torch::empty({world->size(), mine.numel()});
    world->all_gather(all, mine.reshape({-1}).contiguous())->wait();
    return all;
  };
  const torch::Tensor replicated = gathered(first.replicated), split = gathered(first.split);
  for (int r = 1; r < world->size(); ++r) {
    EXPECT_TRUE(torch::equal(replicated[r], replicated[0])) << "rank " << r;
    // Ranks r and r − 2 hold the same tensor-parallel rank in different replicas.
    EXPECT_EQ(torch::equal(split[r], split[r % 2]), true) << "rank " << r;
  }
  EXPECT_FALSE(torch::equal(split[0], split[1]));
  // The attention's dropout acted, each rank on its own heads, and its output (summed
  // over the group) is the same on every rank.
  EXPECT_FALSE(torch::allclose(first.attention, first.attention_without_dropout));
  const torch::Tensor attention = gathered(first.attention);
  for (int r = 1; r < world->size(); ++r) EXPECT_TRUE(torch::equal(attention[r], attention[0])) << "rank " << r;
}

// A trainer that indexes its data by world rank feeds the two halves of a
// tensor-parallel group different micro-batches: every rank of the group stops at the
// first forward with an error naming the group and the cure. Mutant caught: the input
// check removed (the forward then trains on mixed data without a word).
TEST(TpInputCheck, DataIndexedByWorldRankFailsOnEveryRankOfTheGroup) {
  const auto c = make_config(1, {"parallel.tp=2"}, "tp.toml");
  parallax::Runtime rt(c, {{"model", "data"}, /*print_summary=*/false});
  const auto options = gpt::GPTOptions::from_table(rt.config().app_table("model"));
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, c.train.seed);
  gpt::GPT model(options, static_cast<std::uint64_t>(c.train.seed));
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(rt.config()));
  const std::int64_t micro = rt.config().train.micro_batch_size;
  auto [inputs, targets] = data.batch(rt.world().rank() * micro, micro);  // the bug: world rank, not dp rank
  try {
    engine.forward(inputs);
    ADD_FAILURE() << "different inputs across a tensor-parallel group were accepted";
  } catch (const parallax::UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the first forward's input differs across tensor-parallel group"), std::string::npos) << what;
    EXPECT_NE(what.find("index the data by mesh().coord().dp"), std::string::npos) << what;
  }
}

// A model written with the parallel layers (no plan): grouped-query attention whose one
// key/value head is replicated on every rank of the group, trained by the engine with
// clipping tight enough to act every step, matches the same dense model trained by one
// process — so the replicated heads' gradients are summed over their copies and counted
// once in the norm.
struct TinyDenseImpl : torch::nn::Module {
  TinyDenseImpl()
      : embedding(register_module("embedding", torch::nn::Embedding(32, 16))),
        qkv(register_module("qkv", torch::nn::Linear(16, (4 + 2 * 1) * 4))),
        proj(register_module("proj", torch::nn::Linear(16, 16))),
        head(register_module("head", torch::nn::Linear(16, 32))) {}
  torch::Tensor forward(const torch::Tensor& tokens) {
    const torch::Tensor x = embedding(tokens);
    return head(x + dense_reference::dense_attention(qkv, proj, 4, 1, x));
  }
  torch::nn::Embedding embedding;
  torch::nn::Linear qkv, proj, head;
};
TORCH_MODULE(TinyDense);

struct TinyParallelImpl : torch::nn::Module {
  TinyParallelImpl(const TinyDense& dense, parallax::Communicator& tp)
      : embedding(register_module("embedding", dense->embedding)),
        attention(register_module(
            "attention", parallax::tensor_parallel::ParallelCausalSelfAttention(dense->qkv, dense->proj, 4, 1, tp))),
        head(register_module("head", dense->head)) {}
  torch::Tensor forward(const torch::Tensor& tokens) {
    const torch::Tensor x = embedding(tokens);
    return head(x + attention(x));
  }
  torch::nn::Embedding embedding;
  parallax::tensor_parallel::ParallelCausalSelfAttention attention;
  torch::nn::Linear head;
};
TORCH_MODULE(TinyParallel);

std::pair<torch::Tensor, torch::Tensor> tiny_batch(std::int64_t step) {
  torch::manual_seed(100 + step);
  const torch::Tensor tokens = torch::randint(32, {kGlobalBatch, 8});
  return {tokens, (tokens * 7 + 3) % 32};
}

TEST(TpHandWritten, GroupedQueryAttentionLayersMatchTheDenseModel) {
  const auto world = parallax::create_mpi_world_communicator();
  const auto c = make_config(1, {"parallel.tp=2", "optimizer.grad_clip=0.05"});
  const auto spec = parallax::OptimizerSpec::from(c);
  std::vector<double> reference, reference_norms;
  {
    torch::manual_seed(5);
    TinyDense model;
    auto optimizer = equivalence::reference_optimizer(c, *model, model->parameters());
    for (std::int64_t step = 0; step < kSteps; ++step) {
      auto [tokens, targets] = tiny_batch(step);
      const torch::Tensor loss =
          torch::nn::functional::cross_entropy(model(tokens).reshape({-1, 32}), targets.reshape({-1}));
      optimizer->zero_grad();
      loss.backward();
      reference_norms.push_back(torch::nn::utils::clip_grad_norm_(model->parameters(), spec.optimizer.grad_clip));
      parallax::set_learning_rate(*optimizer, parallax::scheduled_lr(spec, step));
      optimizer->step();
      reference.push_back(loss.item<double>());
    }
  }
  parallax::Runtime rt(c, {{"model", "data"}, /*print_summary=*/false});
  torch::manual_seed(5);
  TinyDense dense;
  TinyParallel model(dense, rt.mesh().tp());
  auto engine = rt.engine(model, spec);
  const int dp_rank = rt.mesh().coord().dp;
  const std::int64_t micro = rt.config().train.micro_batch_size;
  double worst = 0.0, worst_norm = 0.0;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    auto [tokens, targets] = tiny_batch(step);
    const torch::Tensor mine = tokens.narrow(0, dp_rank * micro, micro);
    engine.backward(engine.cross_entropy(engine.forward(mine), targets.narrow(0, dp_rank * micro, micro)));
    engine.step();
    const auto i = static_cast<std::size_t>(step);
    worst = std::max(worst, relative_difference(engine.last_loss(), reference[i]));
    // The norm counts the replicated key/value head once (the clipping depends on it).
    worst_norm = std::max(worst_norm, relative_difference(engine.last_metrics().grad_norm, reference_norms[i]));
  }
  EXPECT_LE(worst, 1e-5);
  EXPECT_LE(worst_norm, 1e-5);
  parallax_test::print_figure(
      "hand-written GQA (kv replicated) max per-step loss relative difference %.3g, gradient "
      "norm %.3g\n",
      worst, worst_norm);
}

}  // namespace
