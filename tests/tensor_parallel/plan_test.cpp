// A [tensor_parallel.plan] applied to the GPT example's own model: the split model must
// compute the dense model's loss and gradients (each rank's part of them), agree with
// the same model written with the parallel layers, communicate as often as Megatron's
// blocks do, and refuse plans that do not fit the model with errors that say why.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>

#include "gpt.h"
#include "gpt_training.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/tensor_parallel/parallel_blocks.h"
#include "parallax/tensor_parallel/parallelize.h"
#include "parallax/tensor_parallel/vocab_parallel.h"

namespace {

using parallax::CommOp;
using parallax::Communicator;
namespace tp = parallax::tensor_parallel;

constexpr double kTolerance = 1e-5;

parallax::Config tp_config(const std::vector<std::string>& extra = {}) {
  parallax::ConfigSources sources;
  sources.files = {PARALLAX_SOURCE_DIR "/configs/tp.toml"};
  sources.overrides = {"model.d_model=32", "model.n_layer=2", "model.vocab_size=64"};
  for (const auto& e : extra) sources.overrides.push_back(e);
  return parallax::load_config(sources, {{"model", "data"}});
}

gpt::GPT dense_gpt(const parallax::Config& config) {
  torch::manual_seed(7);
  return gpt::GPT(gpt::GPTOptions::from_table(config.app_table("model")));
}

class Plan : public ::testing::Test {
 protected:
  void SetUp() override { group_ = parallax::create_mpi_world_communicator(); }
  Communicator& group() { return *group_; }
  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  std::unique_ptr<Communicator> group_;
};

struct Pass {
  double loss = 0.0;
  std::map<std::string, torch::Tensor> grads;
};

Pass dense_pass(gpt::GPT& model, const torch::Tensor& inputs, const torch::Tensor& targets) {
  auto loss = gpt::language_model_loss(model->forward(inputs), targets);
  loss.backward();
  Pass pass{loss.item<double>(), {}};
  for (const auto& p : model->named_parameters()) pass.grads[p.key()] = p.value().grad().clone();
  return pass;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LE(diff, kTolerance) << what << " differs by " << diff;
}

class PlanLayouts : public Plan, public ::testing::WithParamInterface<bool> {};

TEST_P(PlanLayouts, SplitGptComputesTheDenseLossAndGradients) {
  const bool sequence_parallel = GetParam();
  const auto config =
      tp_config({"parallel.tp=" + std::to_string(size()),
                 std::string("tensor_parallel.sequence_parallel=") + (sequence_parallel ? "true" : "false")});
  const gpt::SyntheticTokens data(64, 32, 3);
  auto [inputs, targets] = data.batch(0, 4);

  gpt::GPT dense = dense_gpt(config);
  const Pass want = dense_pass(dense, inputs, targets);

  gpt::GPT model = dense_gpt(config);
  tp::ParallelizedModel split(*model, config.tensor_parallel, group());
  ASSERT_EQ(split.split_output_vocabulary(), 64);
  torch::Tensor loss;
  {
    auto scope = split.scope();
    loss = tp::vocab_parallel_cross_entropy(model->forward(inputs), targets, 64, group());
    loss.backward();
  }
  EXPECT_NEAR(loss.item<double>(), want.loss, kTolerance * want.loss);
  std::vector<torch::Tensor> partial;
  for (const auto& p : split.partial_gradient_parameters()) partial.push_back(p.grad());
  EXPECT_EQ(partial.empty(), !sequence_parallel);
  for (auto& g : partial) group().all_reduce(g)->wait();  // what the engine does before the step
  for (const auto& p : model->named_parameters()) {
    const torch::Tensor expected = equivalence::planned_part(p.key(), want.grads.at(p.key()), rank(), size());
    expect_close(p.value().grad(), expected, p.key() + " gradient");
    EXPECT_EQ(split.is_split(p.value()), expected.numel() != want.grads.at(p.key()).numel()) << p.key();
  }
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, PlanLayouts, ::testing::Values(false, true), [](const auto& info) {
  return info.param ? "on" : "off";
});

// The GPT written by hand with the parallel layers, from the same dense modules.
struct HandWrittenGpt {
  explicit HandWrittenGpt(gpt::GPT& dense, Communicator& group, std::int64_t heads) : tp(&group) {
    const auto modules = dense->named_modules();
    auto find = [&modules](const std::string& path) { return modules[path]; };
    token = tp::VocabParallelEmbedding(
        torch::nn::Embedding(std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(find("token_embedding"))), group);
    position = std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(find("position_embedding"));
    for (int b = 0;; ++b) {
      const std::string block = "blocks." + std::to_string(b) + ".";
      if (!modules.contains(block + "qkv")) break;
      auto linear = [&](const std::string& name) {
        return torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(find(block + name)));
      };
      ln1.push_back(torch::nn::LayerNorm(std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(find(block + "ln1"))));
      ln2.push_back(torch::nn::LayerNorm(std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(find(block + "ln2"))));
      attention.push_back(tp::ParallelCausalSelfAttention(linear("qkv"), linear("attn_proj"), heads, group));
      mlp.push_back(tp::ParallelMLP(linear("fc"), linear("mlp_proj"), group));
    }
    ln_f = torch::nn::LayerNorm(std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(find("ln_f")));
    head = tp::ColumnParallelLinear(torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(find("head"))),
                                    group, /*gather_output=*/false);
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = token(tokens) + position(torch::arange(tokens.size(1))).unsqueeze(0);
    for (std::size_t b = 0; b < attention.size(); ++b) {
      x = x + attention[b](ln1[b](x));
      x = x + mlp[b](ln2[b](x));
    }
    return head(ln_f(x));
  }
  Communicator* tp;
  tp::VocabParallelEmbedding token{nullptr};
  torch::nn::Embedding position{nullptr};
  std::vector<torch::nn::LayerNorm> ln1, ln2;
  std::vector<tp::ParallelCausalSelfAttention> attention;
  std::vector<tp::ParallelMLP> mlp;
  torch::nn::LayerNorm ln_f{nullptr};
  tp::ColumnParallelLinear head{nullptr};
};

TEST_F(Plan, PlanGivesWhatTheParallelLayersGive) {
  const auto config = tp_config({"parallel.tp=" + std::to_string(size())});
  const gpt::SyntheticTokens data(64, 32, 3);
  auto [inputs, targets] = data.batch(4, 4);

  gpt::GPT dense = dense_gpt(config);
  HandWrittenGpt written(dense, group(), 4);
  const torch::Tensor written_loss = tp::vocab_parallel_cross_entropy(written.forward(inputs), targets, 64, group());

  gpt::GPT model = dense_gpt(config);
  tp::ParallelizedModel split(*model, config.tensor_parallel, group());
  auto scope = split.scope();
  const torch::Tensor planned_loss = tp::vocab_parallel_cross_entropy(model->forward(inputs), targets, 64, group());
  EXPECT_NEAR(planned_loss.item<double>(), written_loss.item<double>(), 1e-6);
}
}  // namespace
