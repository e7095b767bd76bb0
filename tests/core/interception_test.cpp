// The operator interception mechanism (core/operator_interception.h) on its own: a
// claim refuses a key another library holds, a scope's state reaches exactly the
// operators of its thread and of the work LibTorch carries its state to, nested scopes
// restore the outer state, a paused layer runs operators untouched, and open layers
// meet an operator in their order, each only the operators it routes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <future>
#include <string>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/core/operator_interception.h"

namespace parallax::interception {
namespace {

struct Tagged final : ScopeState {
  explicit Tagged(int id) : id(id) {}
  int id;
};

// What the test handler saw: the tag of the current scope at each intercepted operator.
std::mutex seen_mutex;
std::vector<int> seen;

void record_tag(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto* state = dynamic_cast<const Tagged*>(current(Layer::kTensorParallel));
  {
    std::lock_guard<std::mutex> lock(seen_mutex);
    seen.push_back(state == nullptr ? -1 : state->id);
  }
  Paused paused(Layer::kTensorParallel);
  call_below(Layer::kTensorParallel, op, keys, stack);
}

std::vector<int> take_seen() {
  std::lock_guard<std::mutex> lock(seen_mutex);
  return std::exchange(seen, {});
}

void unrelated_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  call_below(Layer::kParameters, op, keys, stack);
}

// Another library's fallback on the key: Parallax refuses at its claim, naming the key
// (first in this file: any layer's claim registers the key's one fallback)
// and what needs it, instead of failing inside LibTorch's registration (or sharing the
// key silently). Mutant caught: a claim without the check (LibTorch's own "multiple
// backend fallbacks" c10::Error, not a UsageError).
TEST(OperatorInterception, AClaimRefusesAKeyAnotherLibraryHolds) {
  std::string what;
  {
    auto foreign = c10::Dispatcher::singleton().registerFallback(
        dispatch_key(), c10::KernelFunction::makeFallthrough(), "another library");
    try {
      claim(Layer::kParameters, &unrelated_fallback);
    } catch (const UsageError& e) {
      what = e.what();
    }
  }
  EXPECT_NE(what.find("TESTING_ONLY_GenericMode"), std::string::npos) << what;
  EXPECT_NE(what.find("another library"), std::string::npos) << what;
  EXPECT_NE(what.find(to_string(Layer::kParameters)), std::string::npos) << what;
}

// The state travels with LibTorch's thread-local state: an at::launch task started in
// the scope sees it (as autograd's device threads do on a GPU); a thread LibTorch did
// not start sees nothing. Mutant caught: the state kept in a thread_local of its own
// (the launched task would see -1).
TEST(OperatorInterception, AScopesStateReachesItsThreadAndTheWorkItLaunches) {
  claim(Layer::kTensorParallel, &record_tag);
  const torch::Tensor x = torch::ones({4});
  take_seen();
  (void)(x + 1);
  EXPECT_TRUE(take_seen().empty()) << "no scope, no interception";
  {
    Scope scope(Layer::kTensorParallel, std::make_shared<Tagged>(7));
    (void)(x + 1);
    EXPECT_EQ(take_seen(), std::vector<int>{7});
    std::promise<void> done;
    at::launch([&] {
      (void)(x * 2);
      done.set_value();
    });
    done.get_future().wait();
    EXPECT_EQ(take_seen(), std::vector<int>{7});
    std::thread([&] { (void)(x * 3); }).join();
    EXPECT_TRUE(take_seen().empty()) << "a plain std::thread carries no LibTorch state";
  }
  (void)(x + 1);
  EXPECT_TRUE(take_seen().empty());
}

TEST(OperatorInterception, NestedScopesRestoreTheOuterStateAndPausedSkipsTheHandler) {
  claim(Layer::kTensorParallel, &record_tag);
  const torch::Tensor x = torch::ones({4});
  take_seen();
  {
    Scope outer(Layer::kTensorParallel, std::make_shared<Tagged>(1));
    {
      Scope inner(Layer::kTensorParallel, std::make_shared<Tagged>(2));
      (void)(x + 1);
      {
        Paused paused(Layer::kTensorParallel);
        (void)(x + 1);
      }
    }
    (void)(x + 1);
  }
  EXPECT_EQ(take_seen(), (std::vector<int>{2, 1}));
}

// What the attention layer saw: the operators it was handed.
std::vector<std::string> attention_seen;

void record_attention(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  {
    std::lock_guard<std::mutex> lock(seen_mutex);
    attention_seen.push_back(op.operator_name().name);
  }
  call_below(Layer::kAttention, op, keys, stack);
}

// Two layers share the one key: an operator meets the tensor-parallel layer first, and
// the attention layer (claimed for aten::mul only) after it, through call_below; an
// operator the attention layer does not route never reaches it, and a layer with no
// open scope sees nothing. Mutants caught: call_below going straight to the dispatch
// below the key (the attention layer never sees mul while the other layer is open), an
// operator list ignored (it would see add).
TEST(OperatorInterception, OpenLayersMeetAnOperatorInOrderEachOnlyTheOperatorsItRoutes) {
  claim(Layer::kTensorParallel, &record_tag);
  claim(Layer::kAttention, &record_attention, {"aten::mul"});
  const torch::Tensor x = torch::ones({4});
  take_seen();
  attention_seen.clear();
  {
    Scope attention(Layer::kAttention, nullptr);
    (void)(x + x);
    (void)(x * x);
    EXPECT_EQ(attention_seen, std::vector<std::string>{"aten::mul"});
    EXPECT_TRUE(take_seen().empty()) << "the tensor-parallel layer is not open";
    attention_seen.clear();
    {
      Scope rewrite(Layer::kTensorParallel, std::make_shared<Tagged>(3));
      (void)(x + x);
      (void)(x * x);
    }
    EXPECT_EQ(take_seen(), (std::vector<int>{3, 3}));
    EXPECT_EQ(attention_seen, std::vector<std::string>{"aten::mul"});
    EXPECT_EQ(current(Layer::kAttention), nullptr);
  }
  attention_seen.clear();
  (void)(x * x);
  EXPECT_TRUE(attention_seen.empty());
}

// A second claim with another handler is a programming error, named.
TEST(OperatorInterception, ALayerHasOneHandler) {
  claim(Layer::kTensorParallel, &record_tag);
  EXPECT_THROW(claim(Layer::kTensorParallel, &unrelated_fallback), InternalError);
}

}  // namespace
}  // namespace parallax::interception
