// Optimizer construction and the learning-rate schedule.
//
// Parallax uses LibTorch's own optimizers (torch::optim::SGD, Adam, AdamW) so a
// distributed run and a plain single-process run step identically; the engine decides
// which tensors they see (the model's parameters, or fp32 masters under bf16).
//
//   auto spec = OptimizerSpec::from(rt.config());
//   double lr = scheduled_lr(spec, /*step=*/0);     // the lr of the first optimizer step
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "parallax/core/config.h"

namespace parallax {

/// What the engine needs to build and drive the optimizer.
struct OptimizerSpec {
  OptimizerOptions optimizer;
  SchedulerOptions scheduler;
  /// Optimizer steps of the whole run (for decay schedules), e.g. train.steps.
  std::int64_t total_steps = 1;

  /// [optimizer], [scheduler] and train.steps of a loaded config.
  static OptimizerSpec from(const Config& config);
};

/// Learning rate of optimizer step `step` (0-based): linear warmup from lr/warmup to lr
/// over `warmup_steps`, then constant, linear or cosine decay to `min_lr` at
/// `total_steps`. Pure; throws UsageError for step < 0.
double scheduled_lr(const OptimizerSpec& spec, std::int64_t step);

/// A LibTorch optimizer over `params` with the options' hyper-parameters.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        std::vector<torch::Tensor> params);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// Bytes of optimizer state the optimizer holds now (moments, momentum buffers).
std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace parallax
