// A fused CPU Adam/AdamW: the optimizer of ZeRO-Offload, where fp32 master weights and
// moments live in host memory and the step runs on the CPU.
//
// One pass per element reads the parameter, gradient and both moments and writes the
// parameter and both moments: 28 bytes per parameter per step (fp32 gradient), the
// memory traffic floor the bench compares against. The loop is compiled for AVX-512,
// AVX2+FMA and a portable target, chosen at run time by what the CPU supports, and
// split over LibTorch's intra-op thread pool (intra_op_pool.h).
//
// The arithmetic follows torch::optim::Adam / AdamW (LibTorch 1.13) term by term:
//   AdamW:  p ← p·(1 − lr·wd)                      Adam:  g ← g + wd·p
//   m ← β1·m + (1 − β1)·g        v ← β2·v + (1 − β2)·g²
//   p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
// Results agree with LibTorch's to within float rounding (fused multiply-adds round
// once where LibTorch rounds twice); the test bounds the difference over 100 steps.
//
//   CpuAdam adam(CpuAdamOptions(1e-3).betas(0.9, 0.95).weight_decay(0.1).decoupled(true));
//   adam.step(params, grads, exp_avg, exp_avg_sq, numel, /*step=*/1);
#pragma once

#include <cstdint>
#include <vector>

namespace parallax::offload {

struct CpuAdamOptions {
  explicit CpuAdamOptions(double lr) : lr_(lr) {}
  /// Learning rate, > 0.
  CpuAdamOptions& lr(double v) {
    lr_ = v;
    return *this;
  }
  /// Default: 0.9, 0.999.
  CpuAdamOptions& betas(double beta1, double beta2) {
    beta1_ = beta1;
    beta2_ = beta2;
    return *this;
  }
  /// Default: 1e-8.
  CpuAdamOptions& eps(double v) {
    eps_ = v;
    return *this;
  }
  /// L2 (Adam) or decoupled (AdamW) weight decay. Default: 0.
  CpuAdamOptions& weight_decay(double v) {
    weight_decay_ = v;
    return *this;
  }
  /// true: AdamW's decoupled decay; false: Adam's L2 term. Default: false.
  CpuAdamOptions& decoupled(bool v) {
    decoupled_ = v;
    return *this;
  }

  double lr_;
  double beta1_ = 0.9;
  double beta2_ = 0.999;
  double eps_ = 1e-8;
  double weight_decay_ = 0.0;
  bool decoupled_ = false;
};

class CpuAdam {
 public:
  /// Throws ConfigError for options outside their ranges.
  explicit CpuAdam(const CpuAdamOptions& options);

  /// One optimizer step over `numel` elements of contiguous fp32 arrays; `step` is the
  /// 1-based step number (for bias correction). Updates params, exp_avg and exp_avg_sq
  /// in place. Blocks until done; runs on LibTorch's intra-op threads.
  void step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::int64_t numel, std::int64_t step)
      const;
  /// The same with bf16 gradients (raw bf16 bits), widened in the same pass.
  void step(float* params,
            const std::uint16_t* grads_bf16,
            float* exp_avg,
            float* exp_avg_sq,
            std::int64_t numel,
            std::int64_t step) const;

  CpuAdamOptions& options() { return options_; }
  const CpuAdamOptions& options() const { return options_; }
  /// The instruction set the kernel runs with here: "avx512", "avx2" or "portable".
  static const char* instruction_set();
  /// Binds the threads step() runs on (LibTorch's intra-op threads; thread 0 is the
  /// caller) one per PU of `pus`, round-robin, e.g. to core/cpu_binding.h's
  /// rank_cpu_share(). Returns the PU of each thread. Throws TopologyError.
  static std::vector<int> bind_threads(const std::vector<int>& pus);

 private:
  CpuAdamOptions options_;
};

}  // namespace parallax::offload
