// zb-h1's two-pass backward against one whole backward, on one process.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallax/pipeline/split_backward.h"

namespace {

using parallax::pipeline::detail::SplitBackward;

// A residual MLP block with LayerNorm, a weight used twice, and (optionally) an
// embedding of token ids in front: the embedding's use never reaches a float input.
struct Net : torch::nn::Module {
  Net()
      : embedding(register_module("embedding", torch::nn::Embedding(11, 8))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})))),
        up(register_module("up", torch::nn::Linear(8, 16))),
        down(register_module("down", torch::nn::Linear(16, 8))),
        shared(register_parameter("shared", torch::randn({8, 8}))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& tokens) {
    auto h = x + embedding(tokens);
    h = h + down(torch::gelu(up(norm(h))));
    return torch::matmul(torch::matmul(h, shared), shared);  // `shared` used twice
  }

  torch::nn::Embedding embedding;
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
  torch::Tensor shared;
};

std::vector<torch::Tensor> grads_of(Net& net) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : net.parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return grads;
}

TEST(SplitBackward, EqualsOneWholeBackward) {
  torch::manual_seed(3);
  Net net;
  const torch::Tensor x0 = torch::randn({4, 5, 8});
  const torch::Tensor tokens = torch::randint(11, {4, 5});
  const torch::Tensor grad = torch::randn({4, 5, 8});

  torch::Tensor x = x0.clone().requires_grad_(true);
  net.forward(x, tokens).backward(grad);
  const auto want = grads_of(net);
  const torch::Tensor want_input = x.grad().clone();
  net.zero_grad(/*set_to_none=*/true);

  // Two micro-batches accumulate, as in a pipeline: input passes first, then weights.
  std::vector<torch::Tensor> params = net.parameters();
  std::vector<std::unique_ptr<SplitBackward>> splits;
  for (int micro = 0; micro < 2; ++micro) {
    torch::Tensor leaf = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> input_grads;
    splits.push_back(std::make_unique<SplitBackward>(std::vector<torch::Tensor>{net.forward(leaf, tokens)},
                                                     std::vector<torch::Tensor>{grad}, std::vector<torch::Tensor>{leaf},
                                                     params, input_grads));
    ASSERT_EQ(input_grads.size(), 1u);
    EXPECT_TRUE(torch::equal(input_grads[0], want_input));
    EXPECT_FALSE(leaf.grad().defined());  // returned, not accumulated
    // The input pass computed no weight gradient.
    for (const auto& p : params) EXPECT_FALSE(p.grad().defined());
    EXPECT_GT(splits.back()->boundary_nodes(), 0u);
  }
  for (auto& split : splits) {
    split->weight_pass();
    EXPECT_EQ(split->boundary_nodes(), 0u);
  }
  const auto got = grads_of(net);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], 2 * want[i], 1e-6, 1e-7)) << "parameter " << i;
  }
}

TEST(SplitBackward, NoInputGradientMeansOneWholeBackwardLater) {
  torch::manual_seed(4);
  Net net;
  const torch::Tensor x = torch::randn({2, 3, 8});  // data: requires no grad
  const torch::Tensor tokens = torch::randint(11, {2, 3});
  net.forward(x, tokens).sum().backward();
  const auto want = grads_of(net);
  net.zero_grad(/*set_to_none=*/true);
  std::vector<torch::Tensor> input_grads;
  SplitBackward split({net.forward(x, tokens).sum()}, {}, {x}, net.parameters(), input_grads);
  EXPECT_FALSE(input_grads[0].defined());
  for (const auto& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
  split.weight_pass();
  const auto got = grads_of(net);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << i;
}

}  // namespace
