// Two engines in one process, as a GAN trainer has them: the discriminator's step takes
// two losses (two backward calls, real then generated samples), and the generator's loss
// is back-propagated through the discriminator, leaving gradients on the discriminator's
// parameters that the trainer's zero_grad() clears before the discriminator's next step.
// Compared step by step with the plain LibTorch program (one rank) and with its
// data-parallel reference (each rank's shard through the models separately, the
// gradients averaged) at every ZeRO stage, with and without offload, with the module's
// or the trainer's optimizer's zero_grad(). Mutant caught (tried): ZeRO taking every
// backward's gradients where the trainer's zero_grad() cannot reach them (the bug as it
// was reported: the gradient ledger's own/foreign gate and its discard both removed)
// fails every ZeRO case; either half alone is caught by the other.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>

#include "figures.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/mesh.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/runtime/parallax.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/zero/sharded_model.h"
#include "proto/plan.pb.h"

namespace parallax {
namespace {

constexpr std::int64_t kNoise = 4;
constexpr std::int64_t kGlobalBatch = 32;
constexpr int kSteps = 6;

// Small, but with what the real trainers have: BatchNorm in both models, laid out as
// DCGAN lays them out: no bias in front of a normalization (its gradient would be zero
// up to rounding, which Adam's normalized step turns into full-size steps that differ
// with the summation order), and a bias-free last generator layer in front of tanh.
struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(kNoise, 16).bias(false)));
    norm = register_module("norm", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(16, 2).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& noise) { return torch::tanh(fc2(torch::relu(norm(fc1(noise))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(2, 16).bias(false)));
    norm = register_module("norm", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::leaky_relu(norm(fc1(x)), 0.2)).reshape({-1}); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Discriminator);

// Step `step`'s whole batch, the same whoever asks: real samples around (0.5, -0.3), noise.
std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  auto gen = at::detail::createCPUGenerator(100 + step);
  torch::Tensor real = torch::randn({kGlobalBatch, 2}, gen) * 0.1 + torch::tensor({0.5f, -0.3f});
  torch::Tensor noise = torch::randn({kGlobalBatch, kNoise}, gen);
  return {real, noise};
}

torch::optim::AdamOptions adam_options() {
  return torch::optim::AdamOptions(2e-3).betas({0.5, 0.999});
}

torch::Tensor bce(const torch::Tensor& logits, double target) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, target));
}

struct Trajectory {
  std::vector<double> d_losses, g_losses;
  std::vector<torch::Tensor> d_params, g_params;
};

// The plain program, with every data-parallel rank's shard run through the models
// separately (BatchNorm normalizes each shard by itself, as on its rank) and each loss
// divided by the ranks: one rank is the plain program itself. With `g_accum` > 1 the
// generator accumulates that many iterations' gradients per step, as a plain loop does.
Trajectory train_reference(int ranks, bool optimizer_zero_grad, int g_accum = 1) {
  torch::manual_seed(1);
  Generator g;
  Discriminator d;
  torch::optim::Adam g_opt(g->parameters(), adam_options());
  torch::optim::Adam d_opt(d->parameters(), adam_options());
  Trajectory run;
  double g_loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    auto [real, noise] = batch(step);
    const auto reals = real.chunk(ranks), noises = noise.chunk(ranks);
    optimizer_zero_grad ? d_opt.zero_grad() : d->zero_grad();
    double d_loss = 0;
    for (int r = 0; r < ranks; ++r) {
      torch::Tensor loss = bce(d(reals[r]), 1.0);
      (loss / ranks).backward();
      d_loss += loss.item<double>() / ranks;
    }
    std::vector<torch::Tensor> fakes;
    for (int r = 0; r < ranks; ++r) {
      fakes.push_back(g(noises[r]));
      torch::Tensor loss = bce(d(fakes[r].detach()), 0.0);
      (loss / ranks).backward();
      d_loss += loss.item<double>() / ranks;
    }
    d_opt.step();
    if (step % g_accum == 0) optimizer_zero_grad ? g_opt.zero_grad() : g->zero_grad();
    for (int r = 0; r < ranks; ++r) {
      torch::Tensor loss = bce(d(fakes[r]), 1.0);  // through the discriminator, into its .grad too
      (loss / (ranks * g_accum)).backward();
      g_loss += loss.item<double>() / (ranks * g_accum);
    }
    if (step % g_accum == g_accum - 1) {
      g_opt.step();
      run.g_losses.push_back(g_loss);
      g_loss = 0;
    }
    run.d_losses.push_back(d_loss);
  }
  for (const auto& p : d->parameters()) run.d_params.push_back(p.detach().clone());
  for (const auto& p : g->parameters()) run.g_params.push_back(p.detach().clone());
  return run;
}

struct Case {
  int stage;
  const char* offload;
  bool optimizer_zero_grad;
};

std::string name_of(const Case& c) {
  return "zero" + std::to_string(c.stage) + "_offload_" + c.offload +
         (c.optimizer_zero_grad ? "_optimizer_zero_grad" : "_module_zero_grad");
}
void PrintTo(const Case& c, std::ostream* out) {
  *out << name_of(c);
}

Config config_for(const Case& c) {
  ConfigSources sources;
  sources.overrides = {"train.global_batch_size=" + std::to_string(kGlobalBatch), "train.grad_accum=1",
                       "logging.every=0", "zero.stage=" + std::to_string(c.stage),
                       "offload.optimizer=\"" + std::string(c.offload) + "\"",
                       // one ZeRO-3 unit per Linear, and several buckets below stage 3
                       "zero.bucket_mb=0.001", "zero.wrap_min_params=1"};
  return load_config(sources);
}

struct EngineRun {
  Trajectory run;
  std::int64_t d_late_reductions = 0;
  int g_stage = 0, d_stage = 0;
  std::int64_t g_accum = 1;
};

double worst_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

// The trainer's loop: every iteration clears both models' gradients, whatever each
// engine's accumulation (each micro-batch is one iteration of the plain loop).
EngineRun train_engines(Runtime& rt, bool optimizer_zero_grad, bool named) {
  torch::manual_seed(1);  // the same models as the reference (the engines broadcast rank 0's anyway)
  Generator g;
  Discriminator d;
  torch::optim::Adam g_opt(g->parameters(), adam_options());
  torch::optim::Adam d_opt(d->parameters(), adam_options());
  auto g_engine = rt.engine(g, g_opt, named ? EngineOptions("generator") : EngineOptions());
  auto d_engine = rt.engine(d, d_opt, named ? EngineOptions("discriminator") : EngineOptions());
  EngineRun out;
  for (int step = 0; step < kSteps; ++step) {
    auto [real, noise] = d_engine.local_batch(batch(step));
    optimizer_zero_grad ? d_opt.zero_grad() : d->zero_grad();
    d_engine.backward(bce(d_engine.forward(real), 1.0));
    torch::Tensor fake = g_engine.forward(noise);
    d_engine.backward(bce(d_engine.forward(fake.detach()), 0.0));
    EXPECT_TRUE(d_engine.step());
    optimizer_zero_grad ? g_opt.zero_grad() : g->zero_grad();
    g_engine.backward(bce(d_engine.forward(fake), 1.0));
    if (g_engine.step()) out.run.g_losses.push_back(g_engine.last_loss());
    out.run.d_losses.push_back(d_engine.last_loss());
  }
  out.run.d_params = d_engine.master_parameters();
  out.run.g_params = g_engine.master_parameters();
  out.d_late_reductions = d_engine.late_reductions();
  out.g_stage = g_engine.sharded_model() ? g_engine.sharded_model()->stage() : 0;
  out.d_stage = d_engine.sharded_model() ? d_engine.sharded_model()->stage() : 0;
  out.g_accum = g_engine.grad_accum();
  return out;
}

// Losses step by step and final parameters against the reference; the worst of each.
std::pair<double, double> compare(const EngineRun& engines, const Trajectory& reference) {
  double worst_loss = 0;
  EXPECT_EQ(engines.run.d_losses.size(), reference.d_losses.size());
  EXPECT_EQ(engines.run.g_losses.size(), reference.g_losses.size());
  for (std::size_t step = 0; step < reference.d_losses.size() && step < engines.run.d_losses.size(); ++step) {
    worst_loss = std::max(worst_loss, std::abs(engines.run.d_losses[step] - reference.d_losses[step]));
    EXPECT_NEAR(engines.run.d_losses[step], reference.d_losses[step], 6e-7) << "step " << step;
  }
  for (std::size_t step = 0; step < reference.g_losses.size() && step < engines.run.g_losses.size(); ++step) {
    worst_loss = std::max(worst_loss, std::abs(engines.run.g_losses[step] - reference.g_losses[step]));
    EXPECT_NEAR(engines.run.g_losses[step], reference.g_losses[step], 6e-7) << "generator step " << step;
  }
  const double worst_param = std::max(worst_difference(engines.run.d_params, reference.d_params),
                                      worst_difference(engines.run.g_params, reference.g_params));
  EXPECT_LT(worst_param, 1.5e-6);  // measured 1.2e-7 (4 ranks); losses 6e-8 (2 ranks)
  return {worst_loss, worst_param};
}

class GanEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(GanEquivalence, TwoEnginesTwoLossesAndCrossEngineGradientsMatchThePlainProgram) {
  const Case c = GetParam();
  Runtime rt(config_for(c), InitOptions{{}, /*print_summary=*/false});
  const int ranks = rt.mesh().degrees().dp;
  const Trajectory reference = train_reference(ranks, c.optimizer_zero_grad);
  const EngineRun engines = train_engines(rt, c.optimizer_zero_grad, /*named=*/false);
  const auto [worst_loss, worst_param] = compare(engines, reference);
  // Data parallelism launches its all-reduces during the backward it expects to be the
  // step's last: one backward, until the first step shows two (the second then takes one
  // more all-reduce), two from then on. ZeRO reduces every backward, and nothing reaches
  // .grad between the discriminator's last backward and its step.
  EXPECT_EQ(engines.d_late_reductions, c.stage == 0 && ranks > 1 ? 1 : 0);
  parallax_test::print_figure("%d rank(s): max loss difference %.2g, max parameter difference %.2g\n", ranks,
                              worst_loss, worst_param);
}

INSTANTIATE_TEST_SUITE_P(EveryStage,
                         GanEquivalence,
                         ::testing::Values(Case{0, "none", false},
                                           Case{0, "none", true},
                                           Case{1, "none", false},
                                           Case{2, "none", false},
                                           Case{3, "none", false},
                                           Case{3, "none", true},
                                           Case{1, "cpu", false},
                                           Case{2, "cpu", true},
                                           Case{3, "cpu", false}),
                         [](const ::testing::TestParamInfo<Case>& info) { return name_of(info.param); });

}  // namespace
}  // namespace parallax

namespace parallax {
namespace {

// Per-engine options: the generator sharded by ZeRO-3 and accumulating two iterations
// per step, the discriminator replicated (stage 0) and stepping every iteration, from
// [engine.<name>] keys; the trainer's loop clears both models' gradients every
// iteration. Mutants caught: a micro-batch's gradients left within the trainer's
// zero_grad() (the generator then steps on its last iteration alone), and engines
// built from the run's options instead of their tables (the stage checks).
TEST(GanPerEngineOptions, AZero3GeneratorOfItsOwnAccumulationBesideAReplicatedDiscriminator) {
  ConfigSources sources;
  sources.overrides = {"train.global_batch_size=" + std::to_string(kGlobalBatch),
                       "train.grad_accum=1",
                       "logging.every=0",
                       "zero.wrap_min_params=1",
                       "engine.generator.zero.stage=3",
                       "engine.generator.grad_accum=2"};
  const std::vector<std::string> names{"generator", "discriminator"};
  InitOptions init{{}, /*print_summary=*/false};
  init.engines = names;
  Runtime rt(load_config(sources, LoadOptions{{}, names}), init);
  const int ranks = rt.mesh().degrees().dp;
  const EngineRun engines = train_engines(rt, /*optimizer_zero_grad=*/false, /*named=*/true);
  EXPECT_EQ(engines.g_stage, 3);
  EXPECT_EQ(engines.d_stage, 0);
  EXPECT_EQ(engines.g_accum, 2);
  EXPECT_EQ(batch_options(rt.engine_plan("generator")).global_batch_size, 2 * kGlobalBatch);
  EXPECT_EQ(batch_options(rt.engine_plan("discriminator")).global_batch_size, kGlobalBatch);
  const auto [worst_loss, worst_param] = compare(engines, train_reference(ranks, false, /*g_accum=*/2));
  parallax_test::print_figure("%d rank(s): max loss difference %.2g, max parameter difference %.2g\n", ranks,
                              worst_loss, worst_param);
}

}  // namespace
}  // namespace parallax

namespace parallax {
namespace {

// The trainer's random stream is its own. A trainer draws from LibTorch's default
// generator between building its engines and each step, as real ones do (a loader's
// shuffle, label noise with uniform_, dropout on its input); on one rank the engines must
// neither draw from that generator nor reseed it, so the program's losses and parameters
// are the plain program's bit for bit, at every ZeRO stage. SGD with momentum and weight
// decay steps as LibTorch's own class does (no fused kernel), so equal means equal.
// Mutant caught (tried): one torch::rand({1}) in Runtime::engine, after the reseed.
torch::Tensor noisy_labels(const torch::Tensor& logits, double target) {
  return torch::empty_like(logits).uniform_(target == 1.0 ? 0.8 : 0.0, target == 1.0 ? 1.0 : 0.2);
}
torch::Tensor noisy_bce(const torch::Tensor& logits, double target) {
  return torch::binary_cross_entropy_with_logits(logits, noisy_labels(logits, target));
}
torch::optim::SGDOptions sgd_options() {
  return torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2);
}

struct DrawingRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;
};

// `rt` null: the plain program; else the same program through two engines of `rt`.
DrawingRun train_drawing_from_the_default_generator(Runtime* rt) {
  torch::manual_seed(7);
  Generator g;
  Discriminator d;
  torch::optim::SGD g_opt(g->parameters(), sgd_options());
  torch::optim::SGD d_opt(d->parameters(), sgd_options());
  const torch::Tensor order = torch::randperm(kSteps);  // a loader's shuffle, before the engines
  std::optional<ModuleEngine<GeneratorImpl>> g_engine;
  std::optional<ModuleEngine<DiscriminatorImpl>> d_engine;
  if (rt != nullptr) {
    g_engine.emplace(rt->engine(g, g_opt));
    d_engine.emplace(rt->engine(d, d_opt));
  }
  const auto run_d = [&](const torch::Tensor& x) { return d_engine ? d_engine->forward(x) : d->forward(x); };
  const auto run_g = [&](const torch::Tensor& x) { return g_engine ? g_engine->forward(x) : g->forward(x); };
  const auto backward = [](Engine* engine, const torch::Tensor& loss) {
    if (engine != nullptr) {
      engine->backward(loss);
    } else {
      loss.backward();
    }
  };
  DrawingRun run;
  for (int i = 0; i < kSteps; ++i) {
    auto [real, noise] = batch(order[i].item<int>());
    real = torch::dropout(real, 0.1, /*train=*/true);
    d->zero_grad();
    const torch::Tensor d_real = noisy_bce(run_d(real), 1.0);
    backward(d_engine ? &*d_engine : nullptr, d_real);
    const torch::Tensor fake = run_g(noise);
    const torch::Tensor d_fake = noisy_bce(run_d(fake.detach()), 0.0);
    backward(d_engine ? &*d_engine : nullptr, d_fake);
    if (d_engine) {
      d_engine->step();
    } else {
      d_opt.step();
    }
    g->zero_grad();
    const torch::Tensor g_loss = noisy_bce(run_d(fake), 1.0);
    backward(g_engine ? &*g_engine : nullptr, g_loss);
    if (g_engine) {
      g_engine->step();
    } else {
      g_opt.step();
    }
    for (const torch::Tensor& loss : {d_real, d_fake, g_loss}) run.losses.push_back(loss.item<double>());
  }
  if (rt != nullptr) {
    run.params = d_engine->master_parameters();
    for (const torch::Tensor& p : g_engine->master_parameters()) run.params.push_back(p);
  } else {
    for (const auto& p : d->parameters()) run.params.push_back(p.detach().clone());
    for (const auto& p : g->parameters()) run.params.push_back(p.detach().clone());
  }
  return run;
}

class TrainerRandomStream : public ::testing::TestWithParam<int> {};

TEST_P(TrainerRandomStream, OneRankReproducesThePlainProgramBitForBit) {
  if (create_mpi_world_communicator()->size() != 1) GTEST_SKIP() << "the plain program is one process";
  Case c{GetParam(), "none", false};
  Runtime rt(config_for(c), InitOptions{{}, /*print_summary=*/false});
  // The plain program runs under the runtime's thread budget too (a program's init comes
  // first): BLAS and intra-op thread counts change the rounding, not the random stream.
  const DrawingRun plain = train_drawing_from_the_default_generator(nullptr);
  const DrawingRun engines = train_drawing_from_the_default_generator(&rt);
  ASSERT_EQ(engines.losses.size(), plain.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) {
    EXPECT_EQ(engines.losses[i], plain.losses[i]) << "loss " << i % 3 << " of step " << i / 3;
  }
  ASSERT_EQ(engines.params.size(), plain.params.size());
  for (std::size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(engines.params[i], plain.params[i])) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryStage, TrainerRandomStream, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "zero" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace parallax
