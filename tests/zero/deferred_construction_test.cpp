// Deferred construction: a model built under zero::DeferredConstruction holds at most
// two parameters' data at a time while it is built, materializes to exactly the values
// an eager construction from the same seed gives (and leaves the generator where the
// eager construction leaves it), and trains under ZeRO stage 3 like the single-process
// reference while no rank ever holds the whole model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "figures.h"
#include "gpt.h"
#include "gpt_training.h"
#include "parallax/runtime/parallax.h"
#include "parallax/zero/deferred_construction.h"
#include "parallax/zero/sharded_model.h"

namespace {

using namespace equivalence;

std::int64_t largest_parameter_bytes(torch::nn::Module& model) {
  std::int64_t largest = 0;
  for (const auto& p : model.parameters()) largest = std::max(largest, p.numel() * 4);
  return largest;
}

TEST(DeferredConstruction, MaterializesExactlyTheEagerValuesHoldingAtMostTwoParameters) {
  const auto options = gpt::GPTOptions::from_table(make_config(1).app_table("model"));
  torch::manual_seed(42);
  gpt::GPT eager(options);
  const double eager_next = torch::rand({1}).item<double>();

  torch::manual_seed(42);
  std::shared_ptr<gpt::GPTImpl> deferred;
  std::shared_ptr<const parallax::zero::DeferredBytes> held;
  {
    parallax::zero::DeferredConstruction scope(/*min_elements=*/256);
    held = scope.bytes();
    deferred = gpt::GPT(options).ptr();
  }
  // The generator advanced exactly as in the eager construction.
  EXPECT_EQ(torch::rand({1}).item<double>(), eager_next);
  const std::int64_t largest = largest_parameter_bytes(*deferred);
  EXPECT_LE(held->peak(), 2 * largest);
  EXPECT_EQ(held->live(), 0);

  const auto want = eager->parameters();
  const auto got = deferred->parameters();
  ASSERT_EQ(got.size(), want.size());
  std::size_t deferred_count = 0;
  std::int64_t deferred_bytes = 0, total_bytes = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    total_bytes += got[i].numel() * 4;
    if (parallax::zero::is_deferred(got[i])) {
      ++deferred_count;
      deferred_bytes += got[i].numel() * 4;
    }
    parallax::zero::materialize(got[i]);
    EXPECT_FALSE(parallax::zero::is_deferred(got[i]));
    EXPECT_TRUE(torch::equal(got[i], want[i])) << "parameter " << i << " " << got[i].sizes();
  }
  EXPECT_GT(deferred_count, 0u);
  parallax_test::print_figure(
      "deferred %zu of %zu parameters (%lld of %lld bytes); peak held while building %lld bytes\n", deferred_count,
      got.size(), static_cast<long long>(deferred_bytes), static_cast<long long>(total_bytes),
      static_cast<long long>(held->peak()));
}

// A buffer written through data_ptr() (torch::tensor does) is no parameter: it stays
// an ordinary tensor with its values; the parameter after it is deferred.
struct WithTable : torch::nn::Module {
  WithTable() {
    std::vector<float> values(5000);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    table = register_buffer("table", torch::tensor(values));
    weight = register_parameter("weight", torch::randn({100, 100}));
    other = register_parameter("other", torch::randn({100, 100}));
  }
  torch::Tensor table, weight, other;
};

TEST(DeferredConstruction, BuffersFilledThroughDataPtrStayOrdinary) {
  torch::manual_seed(3);
  const WithTable eager;
  torch::manual_seed(3);
  std::shared_ptr<WithTable> deferred;
  {
    parallax::zero::DeferredConstruction scope(/*min_elements=*/256);
    deferred = std::make_shared<WithTable>();
  }
  EXPECT_FALSE(parallax::zero::is_deferred(deferred->table));
  EXPECT_TRUE(torch::equal(deferred->table, torch::arange(5000, torch::kFloat)));
  EXPECT_TRUE(parallax::zero::is_deferred(deferred->weight));
  parallax::zero::materialize(deferred->weight);
  parallax::zero::materialize(deferred->other);
  EXPECT_TRUE(torch::equal(deferred->weight, eager.weight));
  EXPECT_TRUE(torch::equal(deferred->other, eager.other));
}

TEST(DeferredConstruction, WritingOneDeferredTensorFromAnotherIsAClearError) {
  parallax::zero::DeferredConstruction scope(/*min_elements=*/256);
  torch::nn::Module module;
  auto a = module.register_parameter("a", torch::randn({64, 64}));
  auto b = module.register_parameter("b", torch::empty({64, 64}));
  torch::NoGradGuard no_grad;
  try {
    b.copy_(a);
    FAIL() << "a write from one deferred tensor into another was accepted";
  } catch (const parallax::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("writes into a deferred tensor from another deferred tensor"),
              std::string::npos)
        << e.what();
  }
}

TEST(DeferredConstruction, TrainsUnderStage3LikeTheReferenceWithoutEverHoldingTheModel) {
  const auto config = make_config(1, {"zero.stage=3", "zero.wrap=[\"Block\"]", "zero.max_live_mb=0"});
  const Trajectory reference = train_reference(config);

  parallax::Runtime rt(config, {{"model", "data"}, /*print_summary=*/false});
  const auto& c = rt.config();
  const auto options = gpt::GPTOptions::from_table(c.app_table("model"));
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, c.train.seed);
  torch::manual_seed(c.train.seed);  // as the reference; the same on every rank
  std::shared_ptr<gpt::GPTImpl> model;
  std::shared_ptr<const parallax::zero::DeferredBytes> held;
  {
    parallax::zero::DeferredConstruction scope(/*min_elements=*/256);
    held = scope.bytes();
    model = gpt::GPT(options, static_cast<std::uint64_t>(c.train.seed)).ptr();
  }
  const std::int64_t largest_parameter = largest_parameter_bytes(*model);
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(c));
  // Built and sharded: at most two parameters and one unit were ever held at once.
  EXPECT_EQ(held->live(), 0);
  EXPECT_LE(held->peak(), 2 * largest_parameter);

  const int dp_rank = rt.mesh().coord().dp, dp = rt.mesh().degrees().dp;
  Trajectory got;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    auto [inputs, targets] =
        data.batch(gpt::first_sample(step, 0, dp_rank, dp, c.train.micro_batch_size, 1), c.train.micro_batch_size);
    engine.backward(gpt::language_model_loss(engine.forward(inputs), targets));
    engine.step();
    got.losses.push_back(engine.last_loss());
  }
  got.params = engine.master_parameters();
  expect_equivalent(got, reference, kFp32LossTolerance, kFp32ParameterTolerance);
}

}  // namespace
