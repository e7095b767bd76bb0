// Dynamic loss scaling for fp16 training.
//
// fp16 gradients underflow to zero below ~6e-8 and overflow above 65504. The loss is
// multiplied by a scale before backward, and the gradients divided by it before the
// optimizer; the scale adapts:
//  a. A step whose gradients hold inf or NaN on any rank is skipped on every rank (the
//     engine decides "overflow" from a value all ranks share, so they agree).
//  b. The `hysteresis`-th overflowing step since the scale last grew multiplies the
//     scale by `backoff`, and so does every overflow after it until the scale grows;
//     earlier overflows only consume the hysteresis. An overflow that would take the scale below
//     `min_scale` throws: training has diverged, and skipping forever would hide it.
//  c. `growth_interval` consecutive good steps double the scale and restore the
//     hysteresis.
//
//   LossScaler scaler(LossScalerOptions(65536.0).growth_interval(1000));
//   (loss * scaler.scale()).backward();
//   bool skipped = scaler.update(/*overflow=*/!std::isfinite(global_grad_norm));
#pragma once

#include <cstdint>

namespace parallax::zero {

struct LossScalerOptions {
  explicit LossScalerOptions(double initial_scale) : initial_scale_(initial_scale) {}
  /// The first scale, > 0.
  LossScalerOptions& initial_scale(double v) {
    initial_scale_ = v;
    return *this;
  }
  /// Good steps before the scale doubles, ≥ 1. Default: 1000.
  LossScalerOptions& growth_interval(std::int64_t v) {
    growth_interval_ = v;
    return *this;
  }
  /// Factor in (0, 1) applied on backoff. Default: 0.5.
  LossScalerOptions& backoff(double v) {
    backoff_ = v;
    return *this;
  }
  /// Overflows (since the last growth) that back off, ≥ 1. Default: 2.
  LossScalerOptions& hysteresis(std::int64_t v) {
    hysteresis_ = v;
    return *this;
  }
  /// The smallest scale allowed, > 0. Default: 1.
  LossScalerOptions& min_scale(double v) {
    min_scale_ = v;
    return *this;
  }

  double initial_scale_;
  std::int64_t growth_interval_ = 1000;
  double backoff_ = 0.5;
  std::int64_t hysteresis_ = 2;
  double min_scale_ = 1.0;
};

/// What a LossScaler carries from step to step (for checkpoints).
struct LossScalerState {
  double scale = 1.0;
  std::int64_t good_steps = 0;
  std::int64_t hysteresis_left = 0;
  std::int64_t skipped = 0;
};

class LossScaler {
 public:
  /// Throws ConfigError for options outside their ranges.
  explicit LossScaler(const LossScalerOptions& options);

  /// The scale to multiply the loss by for the current step.
  double scale() const { return scale_; }
  /// Records the outcome of a step (see the protocol above). Returns true when the
  /// step must be skipped (overflow). Throws UsageError when the scale would fall below
  /// the minimum.
  bool update(bool overflow);
  /// Overflowing (skipped) steps so far.
  std::int64_t skipped_steps() const { return skipped_; }
  LossScalerState state() const { return {scale_, good_steps_, hysteresis_left_, skipped_}; }
  void restore(const LossScalerState& state) {
    scale_ = state.scale;
    good_steps_ = state.good_steps;
    hysteresis_left_ = state.hysteresis_left;
    skipped_ = state.skipped;
  }

 private:
  LossScalerOptions options_;
  double scale_;
  std::int64_t good_steps_ = 0;
  std::int64_t hysteresis_left_;
  std::int64_t skipped_ = 0;
};

}  // namespace parallax::zero
