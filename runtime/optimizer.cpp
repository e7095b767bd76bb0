#include "parallax/runtime/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "parallax/core/communicator.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

std::int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? payload_bytes(t) : 0;
}

}  // namespace

OptimizerSpec OptimizerSpec::from(const Config& config) {
  OptimizerSpec spec;
  spec.optimizer = config.optimizer;
  spec.scheduler = config.scheduler;
  spec.total_steps = config.train.steps;
  return spec;
}

double scheduled_lr(const OptimizerSpec& spec, std::int64_t step) {
  PARALLAX_CHECK(step >= 0, UsageError, "scheduled_lr: step = ", step, ": expected >= 0");
  const double peak = spec.optimizer.lr;
  const std::int64_t warmup = spec.scheduler.warmup_steps;
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (spec.scheduler.type == SchedulerType::kConstant) return peak;
  const double decay_steps = static_cast<double>(std::max<std::int64_t>(1, spec.total_steps - warmup));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / decay_steps);
  const double floor = spec.scheduler.min_lr;
  if (spec.scheduler.type == SchedulerType::kLinear) return peak - (peak - floor) * progress;
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& o, std::vector<torch::Tensor> params) {
  switch (o.type) {
    case OptimizerType::kSgd:
      return std::make_unique<torch::optim::SGD>(
          std::move(params), torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
    case OptimizerType::kAdam:
      return std::make_unique<torch::optim::Adam>(
          std::move(params),
          torch::optim::AdamOptions(o.lr).betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(o.weight_decay));
    case OptimizerType::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          std::move(params),
          torch::optim::AdamWOptions(o.lr).betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(o.weight_decay));
  }
  throw InternalError("make_optimizer: unknown optimizer type");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t total = 0;
  for (const auto& entry : optimizer.state()) {
    const torch::optim::OptimizerParamState* state = entry.second.get();
    if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      total += bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) + bytes_of(adam->max_exp_avg_sq());
    } else if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      total += bytes_of(adamw->exp_avg()) + bytes_of(adamw->exp_avg_sq()) + bytes_of(adamw->max_exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      total += bytes_of(sgd->momentum_buffer());
    }
  }
  return total;
}

}  // namespace parallax
