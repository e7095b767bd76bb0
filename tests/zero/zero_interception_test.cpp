// ZeRO-3's parameter interception (zero/parameter_interception.h) seen from the engine:
// a released parameter read between steps is a clear error, a step's operators on
// other threads gather as on the step's own thread, and an engine may end on any
// thread. On 1, 2 and 4 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <future>
#include <string>
#include <thread>

#include "awkward_model.h"
#include "parallax/runtime/parallax.h"

namespace parallax {
namespace {

using namespace zero_test;

// Between steps a released parameter holds no data: reading it on the thread that built
// the engine is a UsageError naming the parameter and the way to read weights (not a
// read of released memory, not a collective only some ranks would join);
// master_parameters() is that way. Mutant caught: the former model-lifetime scope,
// under which the read gathers the unit as a collective and returns no error.
TEST(ZeroStage3, ReadingAReleasedParameterBetweenStepsIsAClearError) {
  Runtime rt(awkward_config(3, 1), kQuiet);
  SeededEngine seeded(rt);
  auto& engine = seeded.engine;
  ASSERT_TRUE(train_step(rt, engine, 0));
  const auto params = unique_parameters(*seeded.model);
  std::string what;
  try {
    (void)params.front().sum();
  } catch (const parallax::UsageError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("outside a step"), std::string::npos) << what;
  EXPECT_NE(what.find("master_parameters()"), std::string::npos) << what;
  EXPECT_NE(what.find("'"), std::string::npos) << "names the parameter: " << what;
  // The explicit way still reads every weight, and training goes on.
  EXPECT_EQ(engine.master_parameters().size(), params.size());
  EXPECT_TRUE(train_step(rt, engine, 1));
}

// The engine may end on another thread than the one that built it: neither thread's
// dispatch state is left changed (the building thread's watch ends itself at its next
// operator), and a new engine then trains on the first thread. Mutant caught: a watch
// that does not end itself (the building thread would intercept every operator
// forever). Not observable here: the former model-lifetime key guard, whose destructor
// on the other thread wrote the building thread's key set through the pointer c10's
// guard keeps (a data race, not a wrong final state).
TEST(ZeroStage3, TheEngineCanBeDestroyedOnAnotherThread) {
  constexpr auto kKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
  Runtime rt(awkward_config(3, 1), kQuiet);
  auto seeded = std::make_unique<SeededEngine>(rt);
  ASSERT_TRUE(train_step(rt, seeded->engine, 0));
  bool other_before = true;
  bool other_after = true;
  std::thread([&] {
    other_before = c10::impl::tls_is_dispatch_key_included(kKey);
    seeded.reset();
    other_after = c10::impl::tls_is_dispatch_key_included(kKey);
  }).join();
  EXPECT_FALSE(other_before);
  EXPECT_FALSE(other_after);
  (void)torch::ones({2}).sum();  // the building thread's next operator ends its watch
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(kKey));
  SeededEngine again(rt);
  EXPECT_TRUE(train_step(rt, again.engine, 0));
}

// A step's operators may run on threads its own thread starts (at::launch here; on a
// GPU, autograd's device threads run backward). They carry the scope with LibTorch's
// thread-local state, so released parameters gather there as on the step's thread.
// Mutant caught: the scope kept in a thread_local of its own (the launched forward then
// reads the parameters as if between steps and gets that UsageError).
TEST(ZeroStage3, AForwardOnWorkLaunchedFromTheStepGathersAsOnTheStepsThread) {
  Runtime rt(awkward_config(3, 1), kQuiet);
  SeededEngine seeded(rt);
  auto& model = seeded.model;  // captured below: not a structured binding (C++17)
  auto& engine = seeded.engine;
  const torch::Tensor x = local_batch(rt, 0);
  // The same weights, whole, in a plain copy of the model.
  auto whole = std::make_shared<Awkward>();
  {
    const auto masters = engine.master_parameters();
    const auto params = unique_parameters(*whole);
    ASSERT_EQ(masters.size(), params.size());
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
  }
  const torch::Tensor want = whole->forward(x).detach();
  torch::Tensor got;
  std::string failure;
  {
    ForwardScope scope = engine.forward_scope();
    std::promise<void> done;
    at::launch([&] {
      try {
        got = model->forward(x);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      done.set_value();
    });
    done.get_future().wait();
  }
  ASSERT_TRUE(failure.empty()) << failure;
  EXPECT_TRUE(torch::allclose(got.detach(), want, /*rtol=*/0, /*atol=*/1e-6))
      << (got.detach() - want).abs().max().item<double>();
  engine.backward(loss_of(got));
  EXPECT_TRUE(engine.step());
}

}  // namespace
}  // namespace parallax
