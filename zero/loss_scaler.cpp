#include "parallax/zero/loss_scaler.h"

#include "parallax/core/error.h"

namespace parallax::zero {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.initial_scale_), hysteresis_left_(options.hysteresis_) {
  PARALLAX_CHECK(
      options_.initial_scale_ > 0 && options_.min_scale_ > 0 && options_.min_scale_ <= options_.initial_scale_,
      ConfigError, "loss scaling: initial scale ", options_.initial_scale_, " and minimum ", options_.min_scale_,
      " must satisfy 0 < minimum <= initial");
  PARALLAX_CHECK(options_.backoff_ > 0 && options_.backoff_ < 1, ConfigError, "loss scaling: backoff ",
                 options_.backoff_, " must be in (0, 1)");
  PARALLAX_CHECK(options_.growth_interval_ >= 1 && options_.hysteresis_ >= 1, ConfigError,
                 "loss scaling: growth interval ", options_.growth_interval_, " and hysteresis ", options_.hysteresis_,
                 " must be >= 1");
}

bool LossScaler::update(bool overflow) {
  if (!overflow) {
    if (++good_steps_ == options_.growth_interval_) {
      scale_ *= 2.0;
      good_steps_ = 0;
      hysteresis_left_ = options_.hysteresis_;
    }
    return false;
  }
  ++skipped_;
  good_steps_ = 0;
  if (--hysteresis_left_ > 0) return true;
  const double next = scale_ * options_.backoff_;
  PARALLAX_CHECK(next >= options_.min_scale_, UsageError, "fp16 loss scale would fall to ", next,
                 ", below precision.loss_scale_min = ", options_.min_scale_, " after ", skipped_,
                 " overflowing steps: the gradients are inf/NaN even at the smallest scale (training diverged; "
                 "lower the learning rate or use bf16)");
  scale_ = next;
  hysteresis_left_ = 1;  // after a backoff, the next overflow backs off again at once
  return true;
}

}  // namespace parallax::zero
