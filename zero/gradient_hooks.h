// "This parameter's gradient for this backward is complete": a callback on each
// parameter's gradient accumulator, run after autograd has added the backward's
// contribution into .grad (once per backward, after every use of the parameter has
// contributed). Shared by the data-parallel buckets and the ZeRO groups.
//
//   GradientHooks hooks(params, [&](std::size_t i) { bucket_of(i).ready(i); });
//   loss.backward();   // calls back once per parameter that received a gradient
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace parallax::zero {

class GradientHooks {
 public:
  /// Registers `on_ready(i)` for each `params[i]` (dense leaf tensors that require
  /// grad); throws UsageError naming the index of a parameter that is not a leaf. The
  /// callback runs on the thread autograd runs the accumulator on; it may read and
  /// reset the parameter's .grad.
  GradientHooks(const std::vector<torch::Tensor>& params, std::function<void(std::size_t)> on_ready);
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;
  /// Removes the callbacks.
  ~GradientHooks();

 private:
  std::function<void(std::size_t)> on_ready_;
  /// The accumulators (kept alive: autograd holds them weakly) and our hooks' keys.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
};

}  // namespace parallax::zero
