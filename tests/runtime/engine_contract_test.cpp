// The engine's contract on unusual models and misuse, on several ranks: tied weights
// count once, frozen parameters stay frozen, bool buffers travel, a .grad set to none or
// replaced means what it means in LibTorch, a model that differs across ranks is a clear
// error on every rank, and a metrics file rank 0 cannot open stops every rank at init
// instead of leaving them waiting; gradient all-reduces are launched while backward
// runs; each rank's thread pools are sized, and the rank bound, as its thread budget says.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "parallax/core/config_loader.h"
#include "parallax/core/cpu_binding.h"
#include "parallax/runtime/parallax.h"
#include "parallax/runtime/thread_budget.h"

namespace parallax {
namespace {

const InitOptions kQuiet{{}, /*print_summary=*/false};

Config sgd_config(const std::vector<std::string>& extra = {}) {
  ConfigSources sources;
  // micro_batch_size is inferred from the world size.
  sources.overrides = {"train.global_batch_size=4", "train.grad_accum=1", "optimizer.type=\"sgd\"", "optimizer.lr=0.5",
                       "logging.every=0"};
  for (const auto& e : extra) sources.overrides.push_back(e);
  return load_config(sources);
}

// Two linear layers sharing one weight (as a tied embedding and LM head do), a frozen
// scale and a bool mask buffer.
struct TiedNet : torch::nn::Module {
  TiedNet() {
    weight = register_parameter("encoder_weight", torch::randn({4, 4}) / 4.0);
    register_parameter("decoder_weight", weight);  // the same tensor under a second name
    frozen = register_parameter("frozen", torch::full({4}, 2.0), /*requires_grad=*/false);
    mask = register_buffer("mask", torch::tensor({true, false, true, true}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x.matmul(weight.t()).matmul(weight.t()) * frozen * mask.to(torch::kFloat);
  }
  torch::Tensor weight, frozen, mask;
};

TEST(EngineContract, TiedWeightsCountOnceAndStepLikeOneProcess) {
  Runtime rt(sgd_config(), kQuiet);
  torch::manual_seed(7);
  auto model = std::make_shared<TiedNet>();
  ASSERT_EQ(model->parameters().size(), 3u);  // LibTorch lists the shared weight twice
  auto reference = std::make_shared<TiedNet>();
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(model->weight);
  }
  auto engine = rt.engine(model, OptimizerSpec::from(rt.config()));
  EXPECT_EQ(engine.gradient_bytes(), 16 * 4);  // the shared weight once; the frozen scale not at all

  // Each rank feeds its own batch; the reference steps on the mean of every rank's loss,
  // which a skipped (or sum-instead-of-mean) all-reduce would not reproduce.
  const int world = rt.world().size();
  auto batch_of = [](int rank) { return (torch::arange(8, torch::kFloat).reshape({2, 4}) + rank) / 8.0; };
  engine.backward(engine.forward(batch_of(rt.world().rank())).pow(2).sum());
  ASSERT_TRUE(engine.step());
  torch::Tensor reference_loss = torch::zeros({});
  for (int rank = 0; rank < world; ++rank)
    reference_loss = reference_loss + reference->forward(batch_of(rank)).pow(2).sum();
  (reference_loss / world).backward();
  {
    torch::NoGradGuard no_grad;
    reference->weight.sub_(0.5 * reference->weight.grad());
  }
  EXPECT_TRUE(torch::allclose(model->weight, reference->weight, 1e-6, 1e-7))
      << (model->weight - reference->weight).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(model->frozen, torch::full({4}, 2.0)));
  EXPECT_TRUE(torch::equal(model->mask, torch::tensor({true, false, true, true})));
}

// Gradient reduction overlaps backward: each bucket's all-reduce is launched from the
// hook of its last gradient, inside backward, not after it. Read from the tracer's
// "all_reduce launch" records against the backward span. Mutant caught: the hook-time
// launch removed (finish() then launches every bucket, after backward has returned).
TEST(EngineContract, EveryBucketsAllReduceIsLaunchedWhileBackwardRuns) {
  const std::string trace = testing::TempDir() + "overlap_trace.json";
  int world = 1;
  {
    Runtime rt(sgd_config({"zero.bucket_mb=0.001", "zero.overlap_comm=true", "logging.trace_file=\"" + trace + "\""}),
               kQuiet);
    torch::manual_seed(3);
    auto model = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                                             torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                                             torch::nn::Linear(16, 16));
    auto engine = rt.engine(model, OptimizerSpec::from(rt.config()));
    ASSERT_GE(engine.bucket_count(), 3u);  // a 1 KiB bucket: one per weight
    engine.backward(engine.forward(torch::ones({rt.config().train.micro_batch_size, 16})).pow(2).sum());
    ASSERT_TRUE(engine.step());

    // {"name":"backward",...,"ts":T,"dur":D,...}: the one backward span, and every launch.
    const std::string events = rt.tracer().events_json(0);
    auto field = [&](std::size_t at, const char* key) {
      const std::size_t pos = events.find(key, at) + std::string(key).size();
      return std::stoll(events.substr(pos));
    };
    const std::size_t backward = events.find("{\"name\":\"backward\"");
    ASSERT_NE(backward, std::string::npos) << events;
    const std::int64_t backward_end = field(backward, "\"ts\":") + field(backward, "\"dur\":");
    std::size_t launched_inside = 0, launched = 0;
    for (std::size_t at = events.find("\"all_reduce launch\""); at != std::string::npos;
         at = events.find("\"all_reduce launch\"", at + 1)) {
      ++launched;
      if (field(at, "\"ts\":") <= backward_end) ++launched_inside;
    }
    EXPECT_EQ(launched, engine.bucket_count());
    EXPECT_EQ(launched_inside, engine.bucket_count()) << events;
    world = rt.world().size();
  }  // the runtime writes each rank's trace file
  for (int rank = 0; rank < world; ++rank) std::filesystem::remove(Tracer::per_rank_path(trace, rank));
}

// A .grad set to none (zero_grad(set_to_none), LibTorch 2.x's default) or replaced by
// another tensor means what it means in LibTorch: the gradient is gone, or is that
// tensor; the engine's bucket takes it. Mutant caught: the engine keeping the bucket's
// earlier contents (the stale gradient of the forgotten backward reaches the step).
TEST(EngineContract, GradSetToNoneOrReplacedMeansWhatItMeansInLibTorch) {
  Runtime rt(sgd_config(), kQuiet);
  auto model = std::make_shared<TiedNet>();
  auto engine = rt.engine(model, OptimizerSpec::from(rt.config()));
  const torch::Tensor before = model->weight.detach().clone();
  engine.backward(engine.forward(torch::ones({1, 4})).sum() * 100);  // forgotten below
  model->zero_grad(/*set_to_none=*/true);
  model->weight.mutable_grad() = torch::full({4, 4}, 0.25);  // the gradient now, on every rank
  ASSERT_TRUE(engine.step());  // no backward of its own since: the step takes the .grad above
  EXPECT_TRUE(torch::allclose(model->weight, before - 0.5 * 0.25, 1e-6, 1e-7))
      << (model->weight - (before - 0.125)).abs().max().item<double>();
}

TEST(EngineContract, AModelThatDiffersAcrossRanksFailsOnEveryRank) {
  Runtime rt(sgd_config(), kQuiet);
  const int width = 4 + rt.world().rank();  // rank-dependent: a bug in the user's program
  auto model = std::make_shared<torch::nn::LinearImpl>(width, 2);
  try {
    auto engine = rt.engine(model, OptimizerSpec::from(rt.config()));
    if (rt.world().size() > 1) FAIL() << "the engine accepted different models";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the model differs across ranks"), std::string::npos) << e.what();
  }
}

TEST(EngineContract, AMetricsFileRankZeroCannotOpenStopsEveryRankAtInit) {
  try {
    Runtime rt(sgd_config({"logging.metrics_file=\"/no/such/dir/m.jsonl\""}), kQuiet);
    FAIL() << "init accepted an unwritable metrics file";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("/no/such/dir/m.jsonl") != std::string::npos ||
                what.find("opening logging.metrics_file and logging.tensorboard_dir failed on 1 other rank") !=
                    std::string::npos)
        << what;
  }
}

// After init the pools are what the budget says, whatever they were before (here 3
// each, more than the rank's cores), and a rank that owns its cores runs on them alone.
TEST(EngineContract, InitSizesThePoolsAndBindsTheRankToItsCores) {
  at::set_num_threads(3);
  set_blas_threads(3);
  Runtime rt(sgd_config(), kQuiet);
  const ThreadBudget& budget = rt.threads();
  ASSERT_FALSE(budget.pus.empty());
  EXPECT_EQ(at::get_num_threads(), budget.intra_op);
  if (budget.blas > 0) {
    EXPECT_EQ(blas_threads(), budget.blas);
  }
  if (loaded_blas_threading() == BlasThreading::kOwnThreads) {
    EXPECT_EQ(budget.intra_op, 1);
    EXPECT_EQ(budget.blas, static_cast<int>(budget.pus.size()));
  }
  if (budget.bind) {
    std::string expected;
    for (int pu : budget.pus) expected += (expected.empty() ? "" : ",") + std::to_string(pu);
    if (budget.pus.size() > 1) expected = std::to_string(budget.pus.front()) + "-" + std::to_string(budget.pus.back());
    EXPECT_EQ(calling_thread_binding(), expected);
  }
  std::printf("[ threads  ] rank %d: %s\n", rt.world().rank(),
              describe_thread_budget(budget, loaded_blas_threading()).c_str());
}

}  // namespace
}  // namespace parallax
