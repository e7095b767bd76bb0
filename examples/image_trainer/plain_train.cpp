// A plain LibTorch image classifier, as a user already has it: a small convolutional
// network told which quadrant of a noisy 12x12 image holds a bright square, fed by
// LibTorch's own data loader (a Dataset, Stack, a sequential sampler), stepped by SGD
// with momentum. parallax_train.cpp is the same program made distributed; `diff` them.
#include <torch/torch.h>

#include <cstdio>

struct ConvNet : torch::nn::Module {
  ConvNet() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(16 * 3 * 3, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);  // 12x12 -> 6x6
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);  // 6x6 -> 3x3
    return fc->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
};

// Image i: noise, and a bright 4x4 square in quadrant i % 4 (its label).
struct Squares : torch::data::datasets::Dataset<Squares> {
  torch::data::Example<> get(size_t i) override {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(i));
    const int64_t label = static_cast<int64_t>(i % 4), row = label / 2 * 6 + 1, col = label % 2 * 6 + 1;
    auto image = torch::randn({1, 12, 12}, gen);
    image.slice(1, row, row + 4).slice(2, col, col + 4) += 0.5;
    return {image, torch::tensor(label)};
  }
  torch::optional<size_t> size() const override { return 1024; }
};

int main(int argc, char** argv) {
  torch::manual_seed(0);
  ConvNet model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      Squares().map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions().batch_size(64));
  int64_t step = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      auto loss = torch::cross_entropy_loss(model.forward(batch.data), batch.target);
      loss.backward();
      optimizer.step();
      if (step++ % 8 == 0) std::printf("step %lld loss %.5f\n", (long long)step - 1, loss.item<double>());
    }
  }
}
