// A plain LibTorch training loop, as a user already has it: an MLP fitting y = sin(x·w),
// its model held by value, its own optimizer and its own data. parallax_train.cpp is
// the same loop made distributed; `diff` the two files.
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

// Samples [first, first + count) of the data set, the same whoever asks for them.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t first, int64_t count) {
  auto gen = at::detail::createCPUGenerator(first);
  auto x = torch::randn({count, 16}, gen);
  return {x, torch::sin(x.sum(1, true))};
}

int main(int argc, char** argv) {
  torch::manual_seed(0);
  Net model;
  torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(1e-2));
  const int64_t steps = 100, batch_size = 64;
  for (int64_t step = 0; step < steps; ++step) {
    auto [x, y] = batch(step * batch_size, batch_size);
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model.forward(x), y);
    loss.backward();
    optimizer.step();
    if (step % 20 == 0 || step == steps - 1) std::printf("step %lld loss %.5f\n", (long long)step, loss.item<double>());
  }
}
