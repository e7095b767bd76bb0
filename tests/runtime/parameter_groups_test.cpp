// Parameter groups of their own options, as the GPT recipe has them (weight decay on the
// matrices, none on biases and norms, another learning rate and betas): the trainer's
// torch::optim::AdamW with two groups, handed to the engine, trains as the plain program
// does at every ZeRO stage, step by step, with the schedule scaling each group's
// learning rate as LibTorch's schedulers do (kept in its ratio to group 0's). At stage 3
// each Linear is a unit holding both groups, so units are cut by group. With the
// optimizer offloaded, the host's CPU Adam steps each group's shards with its own rule,
// in host memory and through the NVMe tier's tiles.
// Mutants caught (tried): every group stepped with group 0's options; every group given
// the same (scheduled) learning rate; the offloaded step with one rule for every shard.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <filesystem>

#include "figures.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/mesh.h"
#include "parallax/runtime/parallax.h"
#include "parallax/zero/sharded_model.h"

namespace parallax {
namespace {

constexpr std::int64_t kGlobalBatch = 16;
constexpr int kSteps = 6;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(norm(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Net);

std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  auto gen = at::detail::createCPUGenerator(300 + step);
  return {torch::randn({kGlobalBatch, 6}, gen), torch::randn({kGlobalBatch, 3}, gen)};
}

// The GPT recipe's two groups: matrices decayed; biases and norms not, at a third of the
// learning rate and with other betas, so that a group stepped with another's options, or
// at another's learning rate, shows.
std::unique_ptr<torch::optim::AdamW> grouped_adamw(Net& net) {
  std::vector<torch::Tensor> decayed, plain;
  for (const auto& item : net->named_parameters()) {
    (item.value().dim() >= 2 ? decayed : plain).push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(3e-2).weight_decay(0.5).betas({0.9, 0.95})));
  groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(1e-2).weight_decay(0.0).betas({0.8, 0.99})));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(3e-2));
}

Config config_for(int stage, const std::vector<std::string>& extra = {}) {
  ConfigSources sources;
  sources.overrides = {"train.global_batch_size=" + std::to_string(kGlobalBatch),
                       "train.grad_accum=1",
                       "train.steps=" + std::to_string(kSteps),
                       "logging.every=0",
                       "zero.stage=" + std::to_string(stage),
                       "zero.wrap_min_params=1",
                       // Stage 3 releases every unit the forward moves on from: an operator
                       // that reads two units' parameters must keep both (it read a released
                       // one when their uses were reported one at a time).
                       "zero.max_live_mb=0",
                       "zero.bucket_mb=0.001",
                       "scheduler.type=\"cosine\"",
                       "scheduler.warmup_steps=2"};
  for (const auto& e : extra) sources.overrides.push_back(e);
  return load_config(sources);
}

struct Trajectory {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;
};

// One iteration of the plain program's loop; returns the loss.
template <typename Module>
double plain_step(Module& net, torch::optim::Optimizer& optimizer, const torch::Tensor& x, const torch::Tensor& y) {
  optimizer.zero_grad();
  torch::Tensor loss = torch::mse_loss(net(x), y);
  loss.backward();
  optimizer.step();
  return loss.item<double>();
}

// The plain program: the whole batch, each group's lr set every step to the schedule's
// times its ratio to group 0's initial lr (LibTorch's schedulers scale each group's).
Trajectory plain_run(const OptimizerSpec& schedule) {
  torch::manual_seed(11);
  Net net;
  auto optimizer = grouped_adamw(net);
  std::vector<double> initial;
  for (const auto& group : optimizer->param_groups()) initial.push_back(group.options().get_lr());
  Trajectory run;
  for (int step = 0; step < kSteps; ++step) {
    const double lr = scheduled_lr(schedule, step);
    for (std::size_t g = 0; g < initial.size(); ++g) {
      optimizer->param_groups()[g].options().set_lr(lr * initial[g] / initial[0]);
    }
    auto [x, y] = batch(step);
    run.losses.push_back(plain_step(net, *optimizer, x, y));
  }
  for (const auto& p : net->parameters()) run.params.push_back(p.detach().clone());
  return run;
}

Trajectory engine_run(Runtime& rt) {
  torch::manual_seed(11);
  Net net;
  auto optimizer = grouped_adamw(net);
  auto engine = rt.engine(net, *optimizer);
  Trajectory run;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = engine.local_batch(batch(step));
    optimizer->zero_grad();
    engine.backward(torch::mse_loss(engine.forward(x), y));
    EXPECT_TRUE(engine.step());
    run.losses.push_back(engine.last_loss());
  }
  run.params = engine.master_parameters();
  return run;
}

struct Case {
  int stage;
  const char* offload;  // offload.optimizer
};

// The [offload] keys of a case: the NVMe tier in tiles of 87 elements (3 streams of 4
// bytes in 1 KiB), so that groups and parameters change inside tiles.
std::vector<std::string> offload_keys(const std::string& offload) {
  std::vector<std::string> keys{"offload.optimizer=\"" + offload + "\""};
  if (offload == "nvme") {
    keys.insert(keys.end(), {"offload.nvme_path=\"" + ::testing::TempDir() + "\"", "offload.buffer_mb=0.001",
                             "offload.param=\"nvme\""});
  }
  return keys;
}

class ParameterGroups : public ::testing::TestWithParam<Case> {};

TEST_P(ParameterGroups, TwoGroupsOfTheirOwnOptionsTrainAsThePlainProgram) {
  const int stage = GetParam().stage;
  const std::string offload = GetParam().offload;
  Runtime rt(config_for(stage, offload_keys(offload)), InitOptions{{}, /*print_summary=*/false});
  OptimizerSpec schedule = OptimizerSpec::from(rt.config());
  schedule.optimizer.lr = 3e-2;  // the trainer's group 0 (the config sets [scheduler] keys, not optimizer.lr)
  const Trajectory reference = plain_run(schedule);
  const Trajectory engines = engine_run(rt);
  ASSERT_EQ(engines.losses.size(), reference.losses.size());
  double worst_loss = 0, worst_param = 0;
  for (std::size_t s = 0; s < reference.losses.size(); ++s) {
    worst_loss = std::max(worst_loss, std::abs(engines.losses[s] - reference.losses[s]) / std::abs(reference.losses[s]));
  }
  ASSERT_EQ(engines.params.size(), reference.params.size());
  for (std::size_t i = 0; i < reference.params.size(); ++i) {
    worst_param = std::max(worst_param, (engines.params[i] - reference.params[i]).abs().max().item<double>());
  }
  EXPECT_LT(worst_loss, 1.5e-6);   // measured 1.2e-7 (2 ranks), 0 on one
  EXPECT_LT(worst_param, 6e-7);    // measured 6e-8
  parallax_test::print_figure("zero %d, offload %s, on %d rank(s): max per-step loss relative difference %.2g, max "
                              "parameter difference %.2g\n",
                              stage, offload.c_str(), rt.mesh().degrees().dp, worst_loss, worst_param);
}

INSTANTIATE_TEST_SUITE_P(EveryStage,
                         ParameterGroups,
                         ::testing::Values(Case{0, "none"}, Case{1, "none"}, Case{2, "none"}, Case{3, "none"},
                                           Case{1, "cpu"}, Case{3, "cpu"}, Case{3, "nvme"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "zero" + std::to_string(info.param.stage) + "_offload_" + info.param.offload;
                         });

// ---- Parameters without a gradient, as LibTorch's optimizer skips them ----
//
// A branch that only some steps reach, and on a step only the rank whose rows reach it
// (at stages 0-2; at stage 3 every rank's rows):
// LibTorch 2.x's zero_grad() sets .grad to none, and its AdamW then skips the branch on
// the other steps (no weight decay, no moments, no step count); 1.13's zero_grad()
// zeroes in place, and the branch, once it had a gradient, is stepped with zeros. Its
// first use comes at step 2, so both builds skip it before (Adam's bias correction then
// counts from its own first step). The engine must do what the plain program does with
// the whole batch at every ZeRO stage, offloaded too (the host Adam keeps a step count per
// parameter part), and a checkpoint taken between must keep the branch's own step count. Mutants caught (tried): every parameter stepped whatever its
// gradient (stages 0-3 and offloaded); each rank deciding from its own backwards alone,
// without the union over dp (stages 0-2 on 2 and 4 ranks); the branch's step count not saved (a resume
// at step 4 then counts it from the optimizer's).

constexpr std::int64_t kFeatures = 6;

// The row of the global batch that reaches the branch at each step; -1: none does.
constexpr std::array<std::int64_t, kSteps> kBranchRow{-1, -1, 1, 14, -1, 6};

struct BranchyNetImpl : torch::nn::Module {
  BranchyNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kFeatures, 16));
    branch = register_module("branch", torch::nn::Linear(16, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  // The last input column flags the rows that take the branch; a batch with none of them
  // never calls it (its parameters get no gradient).
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::tanh(fc1(x));
    const torch::Tensor flagged = x.select(1, kFeatures - 1) > 2.5;
    if (flagged.any().item<bool>()) h = h + branch(h) * flagged.unsqueeze(1).to(h.scalar_type());
    return fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, branch{nullptr}, fc2{nullptr};
};
TORCH_MODULE(BranchyNet);

// `every_row`: on the branch's steps every row takes it (zero.stage = 3 gathers a unit
// when a rank first uses it: every rank must use the same units, as under FSDP).
std::pair<torch::Tensor, torch::Tensor> branchy_batch(int step, bool every_row) {
  auto gen = at::detail::createCPUGenerator(500 + step);
  torch::Tensor x = torch::randn({kGlobalBatch, kFeatures}, gen).clamp(-2, 2);
  if (kBranchRow[step] >= 0 && every_row) x.select(1, kFeatures - 1).fill_(3.0);
  if (kBranchRow[step] >= 0) x[kBranchRow[step]][kFeatures - 1] = 3.0;
  return {x, torch::randn({kGlobalBatch, 3}, gen)};
}

std::unique_ptr<torch::optim::AdamW> decaying_adamw(BranchyNet& net) {
  return std::make_unique<torch::optim::AdamW>(net->parameters(),
                                               torch::optim::AdamWOptions(2e-2).weight_decay(0.5).betas({0.8, 0.9}));
}

// `resumed_at`: the program saved its model and optimizer there and resumed (a LibTorch
// checkpoint keeps no .grad: 1.13's zeroed gradients are gone, as they are in the engine's).
Trajectory plain_branchy_run(bool every_row, int resumed_at = -1) {
  torch::manual_seed(13);
  BranchyNet net;
  auto optimizer = decaying_adamw(net);
  Trajectory run;
  for (int step = 0; step < kSteps; ++step) {
    if (step == resumed_at) {
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    }
    auto [x, y] = branchy_batch(step, every_row);
    run.losses.push_back(plain_step(net, *optimizer, x, y));
  }
  for (const auto& p : net->parameters()) run.params.push_back(p.detach().clone());
  return run;
}

// Steps [from, until) on a fresh model and optimizer; loads `load` first when given, and
// saves at the end when `save`, returning the checkpoint's directory in `saved`.
Trajectory engine_branchy_run(Runtime& rt, int from, int until, const std::string& load, std::string* saved) {
  torch::manual_seed(13 + from);  // a resumed run's own weights are replaced by the checkpoint's
  BranchyNet net;
  auto optimizer = decaying_adamw(net);
  auto engine = rt.engine(net, *optimizer);
  if (!load.empty()) engine.load_checkpoint(load);
  Trajectory run;
  for (int step = from; step < until; ++step) {
    auto [x, y] = engine.local_batch(branchy_batch(step, rt.config().zero.stage == 3));
    optimizer->zero_grad();
    engine.backward(torch::mse_loss(engine.forward(x), y));
    EXPECT_TRUE(engine.step());
    run.losses.push_back(engine.last_loss());
  }
  if (saved != nullptr) *saved = engine.save_checkpoint().directory;
  run.params = engine.master_parameters();
  return run;
}

class WithoutGradient : public ::testing::TestWithParam<Case> {};

TEST_P(WithoutGradient, ABranchSomeStepsReachIsSteppedAsThePlainProgramStepsIt) {
  const int stage = GetParam().stage;
  const std::string offload = GetParam().offload;
  // One directory per launch (the ranks of one mpirun share their parent).
  const std::string root = (std::filesystem::temp_directory_path() /
                            ("parallax_without_gradient_" + std::to_string(::getppid()) + "_" + std::to_string(stage)))
                               .string();
  std::vector<std::string> keys = offload_keys(offload);
  keys.insert(keys.end(),
              {"scheduler.type=\"constant\"", "scheduler.warmup_steps=0", "checkpoint.dir=\"" + root + "\""});
  Runtime rt(config_for(stage, keys), InitOptions{{}, /*print_summary=*/false});
  const Trajectory plain = plain_branchy_run(stage == 3);
  const Trajectory plain_resumed = plain_branchy_run(stage == 3, 4);
  const Trajectory whole = engine_branchy_run(rt, 0, kSteps, "", nullptr);
  std::string directory;
  Trajectory resumed = engine_branchy_run(rt, 0, 4, "", &directory);
  const Trajectory rest = engine_branchy_run(rt, 4, kSteps, directory, nullptr);
  resumed.losses.insert(resumed.losses.end(), rest.losses.begin(), rest.losses.end());
  resumed.params = rest.params;
  for (const Trajectory* run : {&whole, static_cast<const Trajectory*>(&resumed)}) {
    const Trajectory& reference = run == &whole ? plain : plain_resumed;
    ASSERT_EQ(run->losses.size(), reference.losses.size());
    double worst_loss = 0, worst_param = 0;
    for (std::size_t s = 0; s < reference.losses.size(); ++s) {
      worst_loss = std::max(worst_loss, std::abs(run->losses[s] - reference.losses[s]) / std::abs(reference.losses[s]));
    }
    ASSERT_EQ(run->params.size(), reference.params.size());
    for (std::size_t i = 0; i < reference.params.size(); ++i) {
      worst_param = std::max(worst_param, (run->params[i] - reference.params[i]).abs().max().item<double>());
    }
    EXPECT_LT(worst_loss, 1.5e-6);  // measured 1.5e-7 (4 ranks), 0 on one
    EXPECT_LT(worst_param, 6e-7);   // measured 6e-8; the mutants above 2.1e-3 and more
    parallax_test::print_figure("zero %d, offload %s, %s: max per-step loss relative difference %.2g, max "
                                "parameter difference %.2g\n",
                                stage, offload.c_str(), run == &whole ? "whole run" : "resumed at step 4", worst_loss,
                                worst_param);
  }
  rt.world().communicator().barrier()->wait();
  if (rt.world().rank() == 0) std::filesystem::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(EveryStage,
                         WithoutGradient,
                         ::testing::Values(Case{0, "none"}, Case{1, "none"}, Case{2, "none"}, Case{3, "none"},
                                           Case{2, "cpu"}, Case{3, "nvme"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "zero" + std::to_string(info.param.stage) + "_offload_" + info.param.offload;
                         });

}  // namespace
}  // namespace parallax
