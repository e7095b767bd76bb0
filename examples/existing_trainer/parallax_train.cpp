// A plain LibTorch training loop, as a user already has it: an MLP fitting y = sin(x·w).
// parallax_train.cpp is the same loop made distributed; `diff` the two files.
#include <parallax/runtime/parallax.h>
#include <torch/torch.h>

#include <cstdio>

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Sample i of the data set, the same whoever asks for it.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t first, int64_t count) {
  auto gen = at::detail::createCPUGenerator(first);
  auto x = torch::randn({count, 16}, gen);
  return {x, torch::sin(x.sum(1, true))};
}

int main(int argc, char** argv) try {
  auto rt = parallax::init(argc, argv);  // + MPI, config, mesh
  torch::manual_seed(0);
  auto model = std::make_shared<Net>();
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(rt.config()));  // + replaces the optimizer
  const int64_t steps = rt.config().train.steps, batch_size = rt.config().train.micro_batch_size;
  const int64_t rank = rt.mesh().coord().dp, ranks = rt.mesh().degrees().dp;  // + this rank's share
  for (int64_t step = 0; step < steps; ++step) {
    auto [x, y] = batch((step * ranks + rank) * batch_size, batch_size);
    auto loss = torch::mse_loss(engine.forward(x), y);
    engine.backward(loss);
    engine.step();
    if (step % 20 == 0 || step == steps - 1) rt.logger().summary("step ", step, " loss ", engine.last_loss());
  }
} catch (const std::exception& e) {
  return parallax::report_error(e);
}
