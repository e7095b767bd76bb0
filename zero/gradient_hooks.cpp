#include "parallax/zero/gradient_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "parallax/core/error.h"

namespace parallax::zero {
namespace {

// Runs after AccumulateGrad has stored this backward's gradient in .grad.
class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradientReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    on_ready_();
    return outputs;
  }

 private:
  std::function<void()> on_ready_;
};

}  // namespace

GradientHooks::GradientHooks(const std::vector<torch::Tensor>& params, std::function<void(std::size_t)> on_ready)
    : on_ready_(std::move(on_ready)) {
  // All checked before any hook is added.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (std::size_t i = 0; i < params.size(); ++i) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(params[i]));
    PARALLAX_CHECK(accumulators.back() != nullptr, UsageError, "parameter ", i, " is not a leaf tensor");
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::uintptr_t key =
        accumulators[i]->add_post_hook(std::make_unique<GradientReadyHook>([this, i] { on_ready_(i); }));
    hooks_.emplace_back(std::move(accumulators[i]), key);
  }
}

GradientHooks::~GradientHooks() {
  for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
}

}  // namespace parallax::zero
