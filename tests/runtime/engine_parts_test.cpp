// The engine's parts on one rank: the learning-rate schedule, optimizer-state
// accounting, a trainer's own optimizer taken over, gradient-bucket layout, the BLAS report and the thread budget.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "figures.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/world.h"
#include "parallax/runtime/blas_info.h"
#include "parallax/runtime/gradient_buckets.h"
#include "parallax/runtime/optimizer.h"
#include "parallax/runtime/thread_budget.h"
#include "parallax/runtime/trainer_optimizer.h"

namespace parallax {
namespace {

OptimizerSpec spec_with(SchedulerType type, std::int64_t warmup) {
  OptimizerSpec spec;
  spec.optimizer.lr = 1.0;
  spec.scheduler.type = type;
  spec.scheduler.warmup_steps = warmup;
  spec.scheduler.min_lr = 0.1;
  spec.total_steps = 14;
  return spec;
}

TEST(Schedule, WarmupRisesLinearlyToThePeak) {
  const auto spec = spec_with(SchedulerType::kConstant, 4);
  EXPECT_DOUBLE_EQ(scheduled_lr(spec, 0), 0.25);
  EXPECT_DOUBLE_EQ(scheduled_lr(spec, 3), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(spec, 13), 1.0);
}

TEST(Schedule, LinearAndCosineDecayToTheFloorAtTheLastStep) {
  const auto linear = spec_with(SchedulerType::kLinear, 4);
  EXPECT_DOUBLE_EQ(scheduled_lr(linear, 4), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(linear, 9), 0.55);  // halfway through 10 decay steps
  EXPECT_DOUBLE_EQ(scheduled_lr(linear, 14), 0.1);
  const auto cosine = spec_with(SchedulerType::kCosine, 4);
  EXPECT_DOUBLE_EQ(scheduled_lr(cosine, 4), 1.0);
  EXPECT_NEAR(scheduled_lr(cosine, 9), 0.55, 1e-12);
  EXPECT_NEAR(scheduled_lr(cosine, 14), 0.1, 1e-12);
  EXPECT_NEAR(scheduled_lr(cosine, 100), 0.1, 1e-12);  // stays at the floor past the end
  EXPECT_THROW(scheduled_lr(cosine, -1), UsageError);
}

TEST(Optimizer, StateBytesCountAdamMomentsAndSgdMomentum) {
  auto weight = torch::zeros({10, 10}, torch::requires_grad());
  weight.mutable_grad() = torch::ones({10, 10});
  OptimizerOptions adam;
  adam.type = OptimizerType::kAdamW;
  auto optimizer = make_optimizer(adam, {weight});
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 0);  // LibTorch allocates moments lazily
  optimizer->step();
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 2 * 100 * 4);

  OptimizerOptions sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.momentum = 0.9;
  auto momentum = make_optimizer(sgd, {weight});
  momentum->step();
  EXPECT_EQ(optimizer_state_bytes(*momentum), 100 * 4);
  set_learning_rate(*momentum, 0.5);
  EXPECT_DOUBLE_EQ(momentum->param_groups()[0].options().get_lr(), 0.5);
}

// The fused CPU pass steps Adam and AdamW as LibTorch does (to within float rounding:
// fused multiply-adds round once), with LibTorch's state and learning rate, and is the
// pass that ran (the counter). Catches a fused step that drops the weight decay, the
// bias correction or the lr change (each moves the parameters by more than 1e-4 here), and a
// kernel that silently falls back to LibTorch's.
TEST(Optimizer, FusedCpuAdamStepsAsLibTorchDoes) {
  for (const OptimizerType type : {OptimizerType::kAdam, OptimizerType::kAdamW}) {
    OptimizerOptions options;
    options.type = type;
    options.lr = 1e-2;
    options.weight_decay = 0.1;
    torch::manual_seed(7);
    const std::vector<torch::Tensor> start{torch::randn({33, 17}), torch::randn({5})};
    std::vector<torch::Tensor> fused_params, plain_params;
    for (const auto& t : start) {
      fused_params.push_back(t.clone().requires_grad_(true));
      plain_params.push_back(t.clone().requires_grad_(true));
    }
    auto fused = make_optimizer(options, fused_params, AdamKernel::kFusedCpu);
    auto plain = make_optimizer(options, plain_params, AdamKernel::kLibTorch);
    for (int step = 0; step < 6; ++step) {
      set_learning_rate(*fused, 1e-2 / (step + 1));
      set_learning_rate(*plain, 1e-2 / (step + 1));
      for (std::size_t i = 0; i < start.size(); ++i) {
        const torch::Tensor grad = torch::randn_like(start[i]);
        fused_params[i].mutable_grad() = grad.clone();
        plain_params[i].mutable_grad() = grad.clone();
      }
      fused->step();
      plain->step();
    }
    double worst = 0;
    for (std::size_t i = 0; i < start.size(); ++i) {
      worst = std::max(worst, (fused_params[i] - plain_params[i]).abs().max().item<double>());
    }
    EXPECT_LT(worst, 5e-7) << to_string(type);  // measured 6.0e-8 (AdamW), 1.9e-9 (Adam)
    EXPECT_EQ(fused_parameter_steps(*fused), 6 * 2) << to_string(type);
    EXPECT_EQ(fused_parameter_steps(*plain), 0);
    EXPECT_EQ(optimizer_state_bytes(*fused), optimizer_state_bytes(*plain));
    parallax_test::print_figure("fused %s vs LibTorch after 6 steps: max parameter difference %.1e\n", to_string(type),
                                worst);
  }
}

class GradientBucketsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int argc = 0;
    char** argv = nullptr;
    world_ = std::make_unique<World>(argc, argv);
  }
  /// All-reduces a bucket takes: none in a group of one, which has nothing to average.
  std::int64_t reduces() const { return world_->size() > 1 ? 1 : 0; }
  std::unique_ptr<World> world_;
  Tracer tracer_{false};
};

TEST_F(GradientBucketsTest, BucketsFollowReverseOrderSizeCapAndDtype) {
  // 4 parameters of 100 floats (400 bytes) with a 1000-byte cap: the last two share a
  // bucket, then the first two; a bf16 parameter never shares with fp32.
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 4; ++i) params.push_back(torch::zeros({100}, torch::requires_grad()));
  params.push_back(torch::zeros({10}, torch::TensorOptions().dtype(torch::kBFloat16).requires_grad(true)));
  GradientBuckets buckets(params, 1000, world_->communicator(), tracer_);
  EXPECT_EQ(buckets.bucket_count(), 3u);
  EXPECT_EQ(buckets.gradient_bytes(), 4 * 400 + 20);
  EXPECT_EQ(buckets.padding_bytes(), 0);
  // .grad of parameters 2 and 3 are adjacent views of one buffer (3 first: reverse order).
  EXPECT_EQ(static_cast<char*>(params[2].grad().data_ptr()) - static_cast<char*>(params[3].grad().data_ptr()), 400);
}

TEST_F(GradientBucketsTest, BackwardAccumulatesIntoTheBucketsAndReducesOnlyWhenArmed) {
  auto weight = torch::ones({3}, torch::requires_grad());
  auto bias = torch::ones({3}, torch::requires_grad());
  GradientBuckets buckets({weight, bias}, 1 << 20, world_->communicator(), tracer_);
  const auto before = world_->communicator().counters()[CommOp::kAllReduce].calls;
  {
    auto own = buckets.own_backward(/*reduce=*/false);
    (weight * 2 + bias).sum().backward();  // micro-step 1: accumulate only
  }
  EXPECT_EQ(world_->communicator().counters()[CommOp::kAllReduce].calls, before);
  {
    auto own = buckets.own_backward(/*reduce=*/true);
    (weight * 2 + bias).sum().backward();  // micro-step 2: reduce as gradients arrive
  }
  buckets.finish();
  EXPECT_EQ(world_->communicator().counters()[CommOp::kAllReduce].calls, before + reduces());
  EXPECT_TRUE(torch::equal(weight.grad(), torch::full({3}, 4.0)));
  EXPECT_TRUE(torch::equal(bias.grad(), torch::full({3}, 2.0)));
  buckets.zero();
  EXPECT_TRUE(torch::equal(weight.grad(), torch::zeros({3})));
}

TEST_F(GradientBucketsTest, WithoutOverlapNothingIsLaunchedBeforeFinish) {
  auto weight = torch::ones({3}, torch::requires_grad());
  GradientBuckets buckets({weight}, 1 << 20, world_->communicator(), tracer_, /*overlap=*/false);
  const auto before = world_->communicator().counters()[CommOp::kAllReduce].calls;
  {
    auto own = buckets.own_backward(/*reduce=*/true);
    (weight * 5).sum().backward();
  }
  EXPECT_EQ(world_->communicator().counters()[CommOp::kAllReduce].calls, before);
  buckets.finish();
  EXPECT_EQ(world_->communicator().counters()[CommOp::kAllReduce].calls, before + reduces());
  EXPECT_TRUE(torch::equal(weight.grad(), torch::full({3}, 5.0)));
}

TEST_F(GradientBucketsTest, UnusedParametersStillReduceInBucketOrder) {
  auto used = torch::ones({2}, torch::requires_grad());
  auto unused = torch::ones({2}, torch::requires_grad());
  GradientBuckets buckets({used, unused}, 8, world_->communicator(), tracer_);  // one per bucket
  ASSERT_EQ(buckets.bucket_count(), 2u);
  {
    auto own = buckets.own_backward(/*reduce=*/true);
    (used * 3).sum().backward();
  }
  buckets.finish();  // launches the unused parameter's bucket too; must not hang
  EXPECT_TRUE(torch::equal(used.grad(), torch::full({2}, 3.0)));
  EXPECT_TRUE(torch::equal(unused.grad(), torch::zeros({2})));
}

TEST_F(GradientBucketsTest, NarrowGradientsAccumulateAndReduceInTheWideDtype) {
  auto weight = torch::ones({3}, torch::TensorOptions().dtype(torch::kBFloat16).requires_grad(true));
  GradientBuckets buckets({weight}, 1 << 20, world_->communicator(), tracer_, true, torch::kFloat32);
  EXPECT_EQ(buckets.gradient_bytes(), 3 * 4);  // reduced in fp32
  EXPECT_EQ(buckets.padding_bytes(), 0);
  EXPECT_EQ(buckets.buffer_bytes(), 3 * 4 + 3 * 2);  // plus the bf16 staging .grad
  // 1/256 is below bf16's resolution at 1 (2^-7): summed in bf16, 256 of them would
  // stall at 1 + 2^-7·k; in fp32 they add up exactly.
  const auto small = torch::full({3}, 1.0 / 256, torch::kFloat32);
  for (int micro = 0; micro < 3; ++micro) {
    auto own = buckets.own_backward(/*reduce=*/micro == 2);
    (weight.to(torch::kFloat32) * (micro == 0 ? torch::ones({3}) : small)).sum().backward();
  }
  buckets.finish();
  EXPECT_EQ(buckets.accumulated_grad(0).scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(buckets.accumulated_grad(0), torch::full({3}, 1.0 + 2.0 / 256)));
  EXPECT_FALSE(weight.grad().defined());  // folded into the fp32 bucket, which the masters' .grad views
}

// A VM whose CPU model OpenBLAS does not know gets the SSE3 kernels unless told: the
// advice names the variable and the core; a right choice gets none.
TEST(Blas, WeakOpenBlasKernelsAreNamedWithTheFix) {
  const std::string advice = openblas_core_advice("Prescott", "SkylakeX");
  EXPECT_NE(advice.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << advice;
  EXPECT_NE(advice.find("Prescott"), std::string::npos) << advice;
  EXPECT_NE(openblas_core_advice("Haswell", "SkylakeX"), "");
  EXPECT_EQ(openblas_core_advice("SkylakeX", "SkylakeX"), "");
  EXPECT_EQ(openblas_core_advice("Haswell", "Haswell"), "");
  EXPECT_EQ(openblas_core_advice("Prescott", ""), "");  // a CPU without AVX2: nothing better
  EXPECT_EQ(openblas_core_advice("", "SkylakeX"), "");  // not OpenBLAS
  std::printf("[ blas     ] OpenBLAS core %s; this CPU's best %s\n", openblas_core().c_str(),
              best_openblas_core_for_this_cpu().c_str());
}

TEST(Blas, TheLoadedBlasIsNamed) {
  auto a = torch::ones({64, 64});
  (void)torch::mm(a, a);
  const std::string blas = describe_loaded_blas();
  EXPECT_NE(blas, "unknown");
  EXPECT_TRUE(is_reference_blas("reference BLAS (/usr/lib/x86_64-linux-gnu/blas/libblas.so.3)"));
  EXPECT_FALSE(is_reference_blas("OpenBLAS 0.3.21 (x)"));
  std::printf("[ blas     ] %s\n", blas.c_str());
}

// The pools never exceed the rank's cores together, and two busy-waiting pools are
// never both given them: BLAS with threads of its own gets the cores, unless the CPU
// Adam (intra-op threads) needs them. Catches a budget that follows OMP_NUM_THREADS or
// sizes both pools to the cores.
TEST(ThreadBudget, PoolsFitTheRanksCoresWithoutTwoSpinningPools) {
  const RankCpus four{{4, 5, 6, 7}, 8, false};  // 2 ranks on 8 usable cores
  const ThreadOptions defaults;
  ThreadBudget own = budget_threads(four, 2, BlasThreading::kOwnThreads, false, defaults);
  EXPECT_EQ(own.intra_op, 1);
  EXPECT_EQ(own.blas, 4);
  EXPECT_TRUE(own.bind);
  ThreadBudget adam = budget_threads(four, 2, BlasThreading::kOwnThreads, true, defaults);
  EXPECT_EQ(adam.intra_op, 4);
  EXPECT_EQ(adam.blas, 1);
  ThreadBudget openmp = budget_threads(four, 2, BlasThreading::kOpenMp, false, defaults);
  EXPECT_EQ(openmp.intra_op, 4);
  EXPECT_EQ(openmp.blas, 0);  // the same pool: nothing else to size
  // More ranks than cores: one core each, shared, so not bound.
  ThreadBudget crowded = budget_threads({{1}, 2, false}, 4, BlasThreading::kOwnThreads, false, defaults);
  EXPECT_FALSE(crowded.bind);
  EXPECT_EQ(crowded.intra_op + crowded.blas, 2);
  // A launcher's binding (mpirun --bind-to core) is kept.
  EXPECT_FALSE(budget_threads({{4, 5}, 8, true}, 2, BlasThreading::kOwnThreads, false, defaults).bind);
  // [threads] overrides, and says so.
  ThreadOptions set;
  set.intra_op = 3;
  set.bind = false;
  ThreadBudget chosen = budget_threads(four, 2, BlasThreading::kOwnThreads, false, set);
  EXPECT_EQ(chosen.intra_op, 3);
  EXPECT_EQ(chosen.blas, 4);
  EXPECT_FALSE(chosen.bind);
  EXPECT_NE(describe_thread_budget(chosen, BlasThreading::kOwnThreads).find("as [threads] sets"), std::string::npos);
}

// Debian's libopenblas0-pthread runs BLAS on threads of its own, and its count is set
// through its API.
TEST(ThreadBudget, TheLoadedBlasThreadsAreSetThroughItsApi) {
  auto a = torch::ones({64, 64});
  (void)torch::mm(a, a);
  const BlasThreading threading = loaded_blas_threading();
  std::printf("[ blas     ] runs on %s, %d thread(s)\n", to_string(threading), blas_threads());
  if (threading != BlasThreading::kOwnThreads) GTEST_SKIP() << "BLAS on " << to_string(threading);
  const int before = blas_threads();
  ASSERT_TRUE(set_blas_threads(1));
  EXPECT_EQ(blas_threads(), 1);
  set_blas_threads(before);
}

// A trainer's own optimizer, read and rebuilt: the rebuilt one steps exactly as the
// trainer's would (same LibTorch class, same options) for every type the engine takes.
// Catches an option dropped or misread in the rebuild (SGD's momentum or nesterov,
// AMSGrad, RMSprop's alpha or centering, Adagrad's lr_decay or starting sums): each moves
// the parameters here.
TEST(TrainerOptimizer, EachTypeIsRebuiltWithItsOptions) {
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;
  const std::vector<std::pair<std::string, Factory>> trainers{
      {"sgd", [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01)); }},
      {"adam", [](auto p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01).betas({0.8, 0.9}).amsgrad(true)); }},
      {"adamw", [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01).weight_decay(0.2)); }},
      {"rmsprop", [](auto p) { return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(0.01).alpha(0.9).centered(true).momentum(0.5)); }},
      {"adagrad", [](auto p) { return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1).lr_decay(0.1).initial_accumulator_value(0.5)); }},
  };
  for (const auto& [name, make] : trainers) {
    torch::manual_seed(3);
    const torch::Tensor start = torch::randn({7, 5});
    auto theirs_param = start.clone().requires_grad_(true);
    auto ours_param = start.clone().requires_grad_(true);
    auto theirs = make({theirs_param});
    const AdoptedOptimizer adopted = read_trainer_optimizer(Config{}, *theirs);
    EXPECT_STREQ(to_string(adopted.spec.optimizer.type), name.c_str());
    EXPECT_TRUE(adopted.overrides.empty());
    EXPECT_EQ(adopted.spec.lr_source, theirs.get());  // the trainer's lr stays live
    auto ours = make_optimizer(adopted.spec.optimizer, {ours_param});
    for (int step = 0; step < 4; ++step) {
      const torch::Tensor grad = torch::randn({7, 5});
      theirs_param.mutable_grad() = grad.clone();
      ours_param.mutable_grad() = grad.clone();
      theirs->step();
      ours->step();
    }
    EXPECT_TRUE(torch::equal(theirs_param, ours_param)) << name;
    EXPECT_FALSE(torch::equal(start, ours_param)) << name;
    EXPECT_EQ(optimizer_steps(*ours), name == "sgd" ? 0 : 4) << name;  // SGD keeps no count
    EXPECT_EQ(optimizer_state_bytes(*ours), optimizer_state_bytes(*theirs)) << name;
  }
}

// Config keys win over the trainer's values and each difference is said; a type that
// contradicts the trainer's, groups with different options, a parameter the optimizer
// lacks or one that has stepped are refused, naming the problem.
TEST(TrainerOptimizer, ConfigKeysOverrideAndMismatchesAreRefused) {
  auto weight = torch::zeros({3}, torch::requires_grad());
  torch::optim::Adam adam({weight}, torch::optim::AdamOptions(0.01));
  Config config;
  config.optimizer.lr = 0.005;
  config.positions["optimizer.lr"] = " at a.toml:3:6";
  config.optimizer.eps = 1e-8;  // the same as the trainer's: no line
  config.positions["optimizer.eps"] = " at a.toml:4:7";
  const AdoptedOptimizer adopted = read_trainer_optimizer(config, adam);
  EXPECT_DOUBLE_EQ(adopted.spec.optimizer.lr, 0.005);
  ASSERT_EQ(adopted.overrides.size(), 1u);
  EXPECT_EQ(adopted.overrides[0],
            "optimizer.lr = 0.005 at a.toml:3:6 overrides the trainer's torch::optim::Adam lr = 0.01");
  EXPECT_EQ(adopted.spec.lr_source, nullptr);  // the config's lr, through its schedule

  config.optimizer.type = OptimizerType::kSgd;
  config.positions["optimizer.type"] = " at a.toml:2:8";
  EXPECT_THROW(read_trainer_optimizer(config, adam), ConfigError);

  auto bias = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD groups({torch::optim::OptimizerParamGroup({weight}),
                            torch::optim::OptimizerParamGroup({bias}, std::make_unique<torch::optim::SGDOptions>(0.5))},
                           torch::optim::SGDOptions(0.1));
  // Groups of different options become parameter groups of their own (group 0's are the spec's).
  const AdoptedOptimizer grouped = read_trainer_optimizer(Config{}, groups);
  ASSERT_EQ(grouped.spec.parameter_groups.size(), 2u);
  EXPECT_EQ(grouped.spec.optimizer.lr, 0.1);
  EXPECT_EQ(grouped.spec.parameter_groups[1].lr, 0.5);

  torch::nn::Linear model(4, 2);
  torch::optim::Adam partial({model->weight}, torch::optim::AdamOptions(0.01));
  try {
    release_trainer_optimizer(partial, *model);
    FAIL() << "an optimizer without the bias was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'bias' requires grad but is not in the trainer's optimizer"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(partial.param_groups().front().params().size(), 1u);  // unchanged when refused

  torch::optim::Adam stepped(model->parameters(), torch::optim::AdamOptions(0.01));
  for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
  stepped.step();
  EXPECT_THROW(release_trainer_optimizer(stepped, *model), UsageError);

  torch::optim::Adagrad fresh(model->parameters(), torch::optim::AdagradOptions(0.1));  // state made eagerly
  const torch::Tensor before = model->weight.detach().clone();
  const torch::Tensor sentinel = release_trainer_optimizer(fresh, *model);
  // Only the sentinel is left, with the state Adagrad's step() requires.
  ASSERT_EQ(fresh.param_groups().front().params().size(), 1u);
  EXPECT_TRUE(fresh.param_groups().front().params().front().is_same(sentinel));
  EXPECT_EQ(fresh.state().size(), 1u);
  sentinel.mutable_grad() = torch::ones({1});  // what the engine's ledger does
  fresh.step();                                 // the trainer's step changes nothing of the model
  EXPECT_TRUE(torch::equal(model->weight, before));
  fresh.zero_grad();  // ... and its zero_grad() reaches the sentinel the engine watches
  EXPECT_TRUE(!sentinel.grad().defined() || sentinel.grad().item<double>() == 0.0);
  EXPECT_DOUBLE_EQ(fresh.param_groups().front().options().get_lr(), 0.1);  // the options stay
}

}  // namespace
}  // namespace parallax
