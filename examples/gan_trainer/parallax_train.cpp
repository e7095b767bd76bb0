// A plain LibTorch GAN trainer, as a user already has it (the shape of PyTorch's C++
// DCGAN example): a generator and a discriminator, each with BatchNorm and its own Adam.
// Per batch the discriminator takes two losses, real samples then generated ones, each
// with its own backward, and one step; the generator's loss runs through the
// discriminator, which leaves gradients on the discriminator's parameters that its
// zero_grad() clears before its next step. The data, points on a ring of 8 Gaussians,
// comes through LibTorch's data loader; the labels' noise comes from LibTorch's default
// generator; the flags are the program's own (getopt_long). parallax_train.cpp is the same
// program made distributed, with two engines (built after the loader) each with its own
// [engine.<name>] options, and the program's flags still getopt_long's: `diff` them. On
// one rank the engines draw nothing from the default generator, so both programs draw
// the same label noise.
#include <torch/torch.h>
#include <parallax/runtime/parallax.h>

#include <getopt.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

constexpr int64_t kNoise = 8;

struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(kNoise, 64).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm1d(64));
    fc2 = register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm1d(64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 2));
  }
  torch::Tensor forward(torch::Tensor z) {
    z = torch::relu(bn1->forward(fc1->forward(z)));
    return fc3->forward(torch::relu(bn2->forward(fc2->forward(z))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::BatchNorm1d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(2, 64));
    fc2 = register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm1d(64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::leaky_relu(fc1->forward(x), 0.2);
    return fc3->forward(torch::leaky_relu(bn2->forward(fc2->forward(x)), 0.2)).flatten();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::BatchNorm1d bn2{nullptr};
};
TORCH_MODULE(Discriminator);

// Sample i: a point near mode i % 8 of a ring of radius 2 (the target is unused).
struct Ring : torch::data::datasets::Dataset<Ring> {
  torch::data::Example<> get(size_t i) override {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(i));
    const double angle = 2 * M_PI * static_cast<double>(i % 8) / 8;
    auto point = torch::tensor({2 * std::cos(angle), 2 * std::sin(angle)}) + 0.05 * torch::randn({2}, gen);
    return {point.to(torch::kFloat), torch::zeros({})};
  }
  torch::optional<size_t> size() const override { return 4096; }
};

// The noise of step `step`'s batch of `n`, the same whoever asks.
torch::Tensor noise_for(int64_t step, int64_t n) {
  return torch::randn({n, kNoise}, at::detail::createCPUGenerator(static_cast<uint64_t>(1000000 + step)));
}

// Noisy labels (real ones in [0.9, 1], generated ones in [0, 0.1]), drawn from the
// default generator as most trainers draw them.
torch::Tensor bce(const torch::Tensor& logits, double target) {
  torch::Tensor labels = torch::empty_like(logits).uniform_(target == 1.0 ? 0.9 : 0.0, target == 1.0 ? 1.0 : 0.1);
  return torch::binary_cross_entropy_with_logits(logits, labels);
}

int main(int argc, char** argv) {
  parallax::InitOptions init;
  init.program_parses_flags = true;
  init.engines = {"generator", "discriminator"};
  auto rt = parallax::init(argc, argv, init);
  int64_t steps = 300, log_every = 50;
  const option flags[] = {{"steps", required_argument, nullptr, 's'},
                          {"log-every", required_argument, nullptr, 'l'},
                          {nullptr, 0, nullptr, 0}};
  for (int flag; (flag = getopt_long(argc, argv, "", flags, nullptr)) != -1;) {
    if (flag == 's') steps = std::atoll(optarg);
    else if (flag == 'l') log_every = std::atoll(optarg);
    else return 2;
  }
  torch::manual_seed(0);
  Generator generator;
  Discriminator discriminator;
  torch::optim::Adam g_optimizer(generator->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  torch::optim::Adam d_optimizer(discriminator->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      Ring().map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions().batch_size(64));
  auto g_engine = rt.engine(generator, g_optimizer, parallax::EngineOptions("generator"));
  auto d_engine = rt.engine(discriminator, d_optimizer, parallax::EngineOptions("discriminator"));
  for (int64_t step = 0; step < steps;) {
    for (auto& whole : *loader) {
      if (step == steps) break;
      torch::Tensor real = d_engine.local_batch(whole.data);
      torch::Tensor noise = d_engine.local_batch(noise_for(step, whole.data.size(0)));

      discriminator->zero_grad();
      torch::Tensor d_loss_real = bce(d_engine.forward(real), 1.0);
      d_engine.backward(d_loss_real);
      torch::Tensor fake = g_engine.forward(noise);
      torch::Tensor d_loss_fake = bce(d_engine.forward(fake.detach()), 0.0);
      d_engine.backward(d_loss_fake);
      d_engine.step();

      generator->zero_grad();
      torch::Tensor g_loss = bce(d_engine.forward(fake), 1.0);
      g_engine.backward(g_loss);
      g_engine.step();
      if ((step % log_every == 0 || step == steps - 1) && rt.is_main()) {
        const double d_loss = d_engine.last_loss();
        std::printf("step %lld d_loss %.4f g_loss %.4f\n", (long long)step, d_loss, g_engine.last_loss());
      }
      ++step;
    }
  }
}
