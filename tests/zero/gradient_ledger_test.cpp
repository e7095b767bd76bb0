// The gradient ledger on real autograd, one process: what a keeper takes, what stays in
// .grad as LibTorch leaves it, and every way a trainer clears a gradient reaching what
// the keeper holds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "parallax/core/error.h"
#include "parallax/zero/gradient_ledger.h"

namespace parallax::zero {
namespace {

// Holds whatever the owner's backward produces, as ZeRO does: taken out of .grad.
struct HoldingKeeper {
  explicit HoldingKeeper(const std::vector<torch::Tensor>& params) : params(params) {
    GradientKeeper keeper;
    keeper.before = [](std::size_t, bool) {};
    keeper.after = [this](std::size_t i, bool own) {
      if (!own) return;
      torch::Tensor& slot = held[i];
      slot = slot.defined() ? slot + this->params[i].grad() : this->params[i].grad().clone();
      ledger->hold(i);
    };
    keeper.discard = [this](std::size_t i) {
      held.erase(i);
      ++discards;
    };
    ledger = std::make_unique<GradientLedger>(params, keeper);
  }
  std::vector<torch::Tensor> params;
  std::map<std::size_t, torch::Tensor> held;
  int discards = 0;
  std::unique_ptr<GradientLedger> ledger;
};

TEST(GradientLedger, OnlyTheOwnersBackwardIsTakenOthersStayInGrad) {
  auto w = torch::ones({2, 3}, torch::requires_grad());
  HoldingKeeper keeper({w});
  (w * 2).sum().backward();  // another model's backward
  EXPECT_TRUE(keeper.held.empty());
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({2, 3}, 2.0)));
  {
    auto own = keeper.ledger->own_backward();
    (w * 3).sum().backward();
  }
  // The owner takes what .grad held (2, from before) plus its own backward's 3.
  ASSERT_EQ(keeper.held.count(0), 1u);
  EXPECT_TRUE(torch::equal(keeper.held[0], torch::full({2, 3}, 5.0)));
  // .grad shows the marker: zeros of the parameter's shape.
  EXPECT_EQ(w.grad().sizes(), w.sizes());
  EXPECT_TRUE(torch::equal(w.grad(), torch::zeros({2, 3})));
  EXPECT_FALSE(keeper.ledger->live(0).defined());
}

TEST(GradientLedger, EveryWayOfZeroingGradReachesWhatTheKeeperHolds) {
  auto w = torch::ones({4}, torch::requires_grad());
  torch::nn::Module module;
  module.register_parameter("w", w);
  HoldingKeeper keeper({w});
  auto take = [&] {
    auto own = keeper.ledger->own_backward();
    (w * 3).sum().backward();
  };
  // Module::zero_grad(set_to_none = false): detached, zeroed in place (1.13's default).
  take();
  module.zero_grad(/*set_to_none=*/false);
  keeper.ledger->sync_all();
  EXPECT_TRUE(keeper.held.empty());
  EXPECT_EQ(keeper.discards, 1);
  // Set to none (2.x's default).
  take();
  module.zero_grad(/*set_to_none=*/true);
  keeper.ledger->sync_all();
  EXPECT_TRUE(keeper.held.empty());
  EXPECT_EQ(keeper.discards, 2);
  // An optimizer's zero_grad() on the parameter itself: detach_(), then zero_() in place.
  take();
  w.mutable_grad().detach_();
  w.mutable_grad().zero_();
  keeper.ledger->sync_all();
  EXPECT_TRUE(keeper.held.empty());
  EXPECT_EQ(keeper.discards, 3);
  // Untouched: nothing is dropped.
  take();
  keeper.ledger->sync_all();
  EXPECT_EQ(keeper.held.count(0), 1u);
  EXPECT_EQ(keeper.discards, 3);
}

// Another backward after the owner took the gradient: the marker leaves .grad before
// autograd adds (it would fail to add into overlapping memory), and zeroing the new
// .grad still drops what the keeper holds; an in-place edit of it is refused.
TEST(GradientLedger, ABackwardOverAHeldGradientAndTheTrainersEdits) {
  auto w = torch::ones({3}, torch::requires_grad());
  HoldingKeeper keeper({w});
  {
    auto own = keeper.ledger->own_backward();
    (w * 3).sum().backward();
  }
  (w * 2).sum().backward();  // another model's
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({3}, 2.0)));
  EXPECT_TRUE(keeper.ledger->foreign(0));
  EXPECT_TRUE(torch::equal(keeper.ledger->live(0), torch::full({3}, 2.0)));
  w.grad().zero_();
  keeper.ledger->sync_all();
  EXPECT_TRUE(keeper.held.empty());
  EXPECT_FALSE(keeper.ledger->foreign(0));

  {
    auto own = keeper.ledger->own_backward();
    (w * 3).sum().backward();
  }
  (w * 2).sum().backward();
  w.grad().mul_(0.5);  // a hand-made clip of a gradient partly held elsewhere
  EXPECT_THROW(keeper.ledger->sync_all(), UsageError);
}

// A buffer shown as .grad (fp32 data parallelism): autograd adds into it; set to none or
// replaced, it comes back holding zeros or the new values.
TEST(GradientLedger, AShownBufferIsTheGradient) {
  auto w = torch::zeros({3}, torch::requires_grad());
  torch::Tensor buffer = torch::zeros({3});
  int discards = 0;
  GradientKeeper keeper;
  keeper.before = [](std::size_t, bool) {};
  keeper.after = [](std::size_t, bool) {};
  keeper.discard = [&](std::size_t) {
    buffer.zero_();
    ++discards;
  };
  GradientLedger ledger({w}, keeper);
  ledger.show(0, buffer);
  (w + 1).sum().backward();
  EXPECT_TRUE(torch::equal(buffer, torch::ones({3})));
  w.mutable_grad() = torch::Tensor();  // set to none, then another backward
  (w * 4).sum().backward();
  EXPECT_EQ(discards, 1);
  EXPECT_TRUE(torch::equal(buffer, torch::full({3}, 4.0)));
  EXPECT_TRUE(ledger.showing(0));
  w.mutable_grad() = torch::full({3}, 7.0);  // replaced
  ledger.sync_all();
  EXPECT_TRUE(torch::equal(buffer, torch::full({3}, 7.0)));
  EXPECT_TRUE(ledger.showing(0));
}

// The trainer's optimizer keeps a sentinel: its zero_grad() clears every gradient, and
// is seen before the next accumulation, so a backward after it keeps its own gradient.
TEST(GradientLedger, TheTrainersOptimizerZeroGradClearsEverythingBeforeTheNextBackward) {
  auto w = torch::ones({2}, torch::requires_grad());
  HoldingKeeper keeper({w});
  torch::Tensor sentinel = torch::zeros({1});
  torch::optim::SGD optimizer({sentinel}, torch::optim::SGDOptions(0.1));
  keeper.ledger->watch_zero_grad(sentinel);
  {
    auto own = keeper.ledger->own_backward();
    (w * 3).sum().backward();
  }
  optimizer.zero_grad();
  (w * 2).sum().backward();  // another model's, after the zero_grad: it stays
  EXPECT_TRUE(keeper.held.empty());
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({2}, 2.0)));
  optimizer.zero_grad();
  keeper.ledger->sync_all();
  EXPECT_FALSE(w.grad().defined());
}

}  // namespace
}  // namespace parallax::zero
