// A [tensor_parallel.plan] applied to the GPT example's own model: the split model must
// compute the dense model's loss and gradients (each rank's part of them), agree with
// the same model written with the parallel layers, communicate as often as Megatron's
// blocks do, and refuse plans that do not fit the model with errors that say why.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
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
    EXPECT_EQ(split.copies(p.value()), expected.numel() != want.grads.at(p.key()).numel() ? 1 : size()) << p.key();
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

namespace {

struct Counts {
  parallax::CommCounters forward, backward;
};

// The tensor-parallel group's traffic in one forward and one backward of a GPT of `layers`.
Counts traffic(Communicator& group,
               std::int64_t layers,
               bool sequence_parallel,
               const torch::Tensor& inputs,
               const torch::Tensor& targets) {
  const auto config =
      tp_config({"parallel.tp=" + std::to_string(group.size()), "model.n_layer=" + std::to_string(layers),
                 std::string("tensor_parallel.sequence_parallel=") + (sequence_parallel ? "true" : "false")});
  gpt::GPT model = dense_gpt(config);
  tp::ParallelizedModel split(*model, config.tensor_parallel, group);
  auto scope = split.scope();
  const auto start = group.counters();
  const torch::Tensor logits = model->forward(inputs);
  const auto forward_done = group.counters();
  const torch::Tensor loss = tp::vocab_parallel_cross_entropy(logits, targets, 64, group);
  const auto loss_done = group.counters();
  loss.backward();
  return {forward_done.since(start), group.counters().since(loss_done)};
}

class BlockTraffic : public Plan, public ::testing::WithParamInterface<bool> {};

// Megatron's count: per transformer block and micro-batch, 2 all-reduces of the block's
// activations [b, s, h] forward and 2 backward; with sequence parallelism each becomes
// an all-gather and a reduce-scatter of the same bytes.
TEST_P(BlockTraffic, EachBlockCommunicatesAsMegatronsDoes) {
  const bool sequence_parallel = GetParam();
  const gpt::SyntheticTokens data(64, 32, 3);
  auto [inputs, targets] = data.batch(0, 4);
  const Counts two = traffic(group(), 2, sequence_parallel, inputs, targets);
  const Counts three = traffic(group(), 3, sequence_parallel, inputs, targets);
  const std::int64_t activation_bytes = 4 * 32 * 32 * 4;  // b · s · h · fp32
  for (const auto& [name, one_block] : {std::make_pair("forward", three.forward.since(two.forward)),
                                        std::make_pair("backward", three.backward.since(two.backward))}) {
    if (sequence_parallel) {
      EXPECT_EQ(one_block[CommOp::kAllReduce].calls, 0) << name;
      EXPECT_EQ(one_block[CommOp::kAllGather].calls, 2) << name;
      EXPECT_EQ(one_block[CommOp::kReduceScatter].calls, 2) << name;
      EXPECT_EQ(one_block[CommOp::kAllGather].bytes, 2 * activation_bytes) << name;
      EXPECT_EQ(one_block[CommOp::kReduceScatter].bytes, 2 * activation_bytes) << name;
    } else {
      EXPECT_EQ(one_block[CommOp::kAllReduce].calls, 2) << name;
      EXPECT_EQ(one_block[CommOp::kAllReduce].bytes, 2 * activation_bytes) << name;
      EXPECT_EQ(one_block[CommOp::kAllGather].calls + one_block[CommOp::kReduceScatter].calls, 0) << name;
    }
  }
  // Outside the blocks: the embedding's reduction forward, the head's input gradient
  // backward (each an all-reduce, or its sequence-parallel pair).
  const auto& edges = two.forward;
  EXPECT_EQ(edges[CommOp::kAllReduce].calls + edges[CommOp::kReduceScatter].calls + edges[CommOp::kAllGather].calls,
            2 * 2 + 1 + (sequence_parallel ? 2 * 2 + 1 : 0));
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, BlockTraffic, ::testing::Values(false, true), [](const auto& info) {
  return info.param ? "on" : "off";
});

std::string plan_error(const parallax::Config& config, Communicator& group) {
  gpt::GPT model = dense_gpt(config);
  try {
    tp::ParallelizedModel split(*model, config.tensor_parallel, group);
  } catch (const parallax::ConfigError& e) {
    return e.detail();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

#define EXPECT_CONTAINS(text, needle) EXPECT_NE(std::string(text).find(needle), std::string::npos) << "in: " << (text)

// The LM head's logits gathered (gather_output): the ordinary dense loss applies, and
// the padding of a vocabulary that does not divide by tp is cut off again.
TEST_F(Plan, GatheredLogitsGiveTheDenseLoss) {
  parallax::Config config = tp_config({"parallel.tp=" + std::to_string(size()), "model.vocab_size=63"});
  for (auto& rule : config.tensor_parallel.plan) {
    if (rule.pattern == "head") rule.gather_output = true;
  }
  const gpt::SyntheticTokens data(63, 32, 3);
  auto [inputs, targets] = data.batch(0, 4);
  gpt::GPT dense = dense_gpt(config);
  const Pass want = dense_pass(dense, inputs, targets);
  gpt::GPT model = dense_gpt(config);
  tp::ParallelizedModel split(*model, config.tensor_parallel, group());
  EXPECT_EQ(split.split_output_vocabulary(), 0);
  auto scope = split.scope();
  const torch::Tensor logits = model->forward(inputs);
  ASSERT_EQ(logits.size(-1), 63);
  EXPECT_NEAR(gpt::language_model_loss(logits, targets).item<double>(), want.loss, kTolerance * want.loss);
}

// An LM head tied to the embedding cannot be split by a plan; the model stays whole.
struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    embedding = register_module("embedding", torch::nn::Embedding(16, 8));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(8, 16).bias(false)));
    head->weight = embedding->weight;
  }
  torch::nn::Embedding embedding{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Tied);

TEST_F(Plan, PlansThatDoNotFitTheModelSayWhy) {
  {
    parallax::TensorParallelOptions tied_plan;
    tied_plan.plan = {{"embedding", parallax::TpStyle::kVocabEmbedding, 1, 0, false, " at t.toml:2:1"},
                      {"head", parallax::TpStyle::kVocabOutput, 1, 0, false, " at t.toml:3:1"}};
    Tied tied;
    const torch::Tensor before = tied->embedding->weight.clone();
    try {
      tp::ParallelizedModel split(*tied, tied_plan, group());
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const parallax::ConfigError& e) {
      EXPECT_NE(std::string(e.detail()).find("head and embedding share one weight (tied weights)"), std::string::npos)
          << e.detail();
    }
    EXPECT_TRUE(torch::equal(tied->embedding->weight, before));  // nothing was sliced
  }

  const std::string tp_set = "parallel.tp=" + std::to_string(size());
  const parallax::Config config = tp_config({tp_set});

  parallax::Config missing = config;
  auto& rules = missing.tensor_parallel.plan;
  rules.erase(std::remove_if(rules.begin(), rules.end(), [](const auto& r) { return r.pattern == "blocks.*.fc"; }),
              rules.end());
  const std::string unmatched = plan_error(missing, group());
  EXPECT_CONTAINS(unmatched,
                  "leaves 2 Linear/Embedding module(s) unmatched: blocks.0.fc (Linear), blocks.1.fc (Linear)");
  EXPECT_CONTAINS(unmatched, "tp.toml");
  EXPECT_CONTAINS(unmatched, "style \"replicate\" keeps a module whole");

  parallax::Config typo = config;
  typo.tensor_parallel.plan.push_back({"blocks.*.qvk", parallax::TpStyle::kColumn, 1, 0, false, " at x.toml:9:1"});
  EXPECT_CONTAINS(plan_error(typo, group()), "tensor_parallel.plan.\"blocks.*.qvk\" at x.toml:9:1 matches no Linear");

  parallax::Config twice = config;
  twice.tensor_parallel.plan.push_back({"blocks.0.*", parallax::TpStyle::kReplicate, 1, 0, false, " at x.toml:9:1"});
  EXPECT_CONTAINS(plan_error(twice, group()), "is matched by two rules");

  parallax::Config wrong_type = config;
  for (auto& rule : wrong_type.tensor_parallel.plan) {
    if (rule.pattern == "token_embedding") rule.style = parallax::TpStyle::kColumn;
  }
  EXPECT_CONTAINS(plan_error(wrong_type, group()),
                  "style \"column\" applies to a Linear, but token_embedding is an Embedding");

  // Heads that do not divide over the group: a rank would get a fraction of a head.
  parallax::Config heads = tp_config({tp_set, "model.n_head=2", "model.d_model=24"});
  for (auto& rule : heads.tensor_parallel.plan) {
    if (rule.heads > 0) rule.heads = size() == 2 ? 3 : 2;
  }
  const std::string cut = plan_error(heads, group());
  EXPECT_CONTAINS(cut, size() == 2 ? "do not divide by parallel.tp = 2" : "do not divide by parallel.tp = 4");
}

}  // namespace
