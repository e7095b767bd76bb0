#include "parallax/offload/cpu_adam.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#include "parallax/core/cpu_binding.h"
#include "parallax/core/error.h"
#include "parallax/offload/intra_op_pool.h"

namespace parallax::offload {
namespace {

// Per-step constants, computed once in double as LibTorch does, then narrowed.
struct StepConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float neg_step_size;          // −lr / (1 − β1^t)
  float bias_correction2_sqrt;  // √(1 − β2^t)
  float eps;
  float weight_decay;  // Adam: added to the gradient
  float decay_factor;  // AdamW: 1 − lr·wd
  bool decoupled;
};

inline float widen(float g) {
  return g;
}
inline float widen(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// The fused update over [begin, end). Written so the compiler vectorizes it for the
// target each wrapper below names.
template <typename Grad>
inline void adam_kernel(float* __restrict p,
                        const Grad* __restrict g,
                        float* __restrict m,
                        float* __restrict v,
                        std::int64_t begin,
                        std::int64_t end,
                        const StepConstants& c) {
#if defined(__clang__)
#pragma clang loop vectorize(enable)
#else
#pragma GCC ivdep
#endif
  for (std::int64_t i = begin; i < end; ++i) {
    // Each line rounds where LibTorch's vectorized kernels round: add(x, alpha) is a
    // fused multiply-add there, addcmul and addcdiv multiply by the scalar first.
    float param = p[i];
    float grad = widen(g[i]);
    if (c.decoupled) {
      param = param * c.decay_factor;
    } else {
      grad = std::fma(param, c.weight_decay, grad);
    }
    const float avg = std::fma(grad, c.one_minus_beta1, m[i] * c.beta1);
    const float avg_sq = v[i] * c.beta2 + (c.one_minus_beta2 * grad) * grad;
    const float denom = std::sqrt(avg_sq) / c.bias_correction2_sqrt + c.eps;
    m[i] = avg;
    v[i] = avg_sq;
    p[i] = param + (c.neg_step_size * avg) / denom;
  }
}

template <typename Grad>
__attribute__((target("avx512f,avx512vl,fma"))) void kernel_avx512(
    float* p, const Grad* g, float* m, float* v, std::int64_t b, std::int64_t e, const StepConstants& c) {
  adam_kernel(p, g, m, v, b, e, c);
}
template <typename Grad>
__attribute__((target("avx2,fma"))) void kernel_avx2(
    float* p, const Grad* g, float* m, float* v, std::int64_t b, std::int64_t e, const StepConstants& c) {
  adam_kernel(p, g, m, v, b, e, c);
}
template <typename Grad>
void kernel_portable(
    float* p, const Grad* g, float* m, float* v, std::int64_t b, std::int64_t e, const StepConstants& c) {
  adam_kernel(p, g, m, v, b, e, c);
}

enum class Isa { kAvx512, kAvx2, kPortable };

Isa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kPortable;
}

const Isa kIsa = detect();

// Elements per task: large enough to amortize scheduling, a multiple of 64 so every
// task but the last starts on a cache line.
constexpr std::int64_t kGrain = 1 << 16;

template <typename Grad>
void run(const CpuAdamOptions& o, float* p, const Grad* g, float* m, float* v, std::int64_t numel, std::int64_t step) {
  PARALLAX_CHECK(step >= 1, UsageError, "CpuAdam::step: step numbers start at 1, got ", step);
  PARALLAX_CHECK(numel >= 0, UsageError, "CpuAdam::step: numel must be >= 0, got ", numel);
  const double bias_correction1 = 1.0 - std::pow(o.beta1_, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(o.beta2_, static_cast<double>(step));
  const StepConstants c{static_cast<float>(o.beta1_),
                        static_cast<float>(1.0 - o.beta1_),
                        static_cast<float>(o.beta2_),
                        static_cast<float>(1.0 - o.beta2_),
                        static_cast<float>(-o.lr_ / bias_correction1),
                        static_cast<float>(std::sqrt(bias_correction2)),
                        static_cast<float>(o.eps_),
                        static_cast<float>(o.weight_decay_),
                        static_cast<float>(1.0 - o.lr_ * o.weight_decay_),
                        o.decoupled_};
  intra_op_parallel_for(numel, kGrain, [&](std::int64_t begin, std::int64_t end) {
    switch (kIsa) {
      case Isa::kAvx512:
        kernel_avx512(p, g, m, v, begin, end, c);
        break;
      case Isa::kAvx2:
        kernel_avx2(p, g, m, v, begin, end, c);
        break;
      case Isa::kPortable:
        kernel_portable(p, g, m, v, begin, end, c);
        break;
    }
  });
}

}  // namespace

CpuAdam::CpuAdam(const CpuAdamOptions& options) : options_(options) {
  PARALLAX_CHECK(options_.lr_ > 0, ConfigError, "CpuAdam: lr = ", options_.lr_, ", expected > 0");
  PARALLAX_CHECK(options_.beta1_ >= 0 && options_.beta1_ < 1 && options_.beta2_ >= 0 && options_.beta2_ < 1,
                 ConfigError, "CpuAdam: betas = [", options_.beta1_, ", ", options_.beta2_,
                 "], expected each in [0, 1)");
  PARALLAX_CHECK(options_.eps_ > 0 && options_.weight_decay_ >= 0, ConfigError, "CpuAdam: eps = ", options_.eps_,
                 " (expected > 0), weight_decay = ", options_.weight_decay_, " (expected >= 0)");
}

void CpuAdam::step(
    float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::int64_t numel, std::int64_t step) const {
  run(options_, params, grads, exp_avg, exp_avg_sq, numel, step);
}

void CpuAdam::step(float* params,
                   const std::uint16_t* grads_bf16,
                   float* exp_avg,
                   float* exp_avg_sq,
                   std::int64_t numel,
                   std::int64_t step) const {
  run(options_, params, grads_bf16, exp_avg, exp_avg_sq, numel, step);
}

const char* CpuAdam::instruction_set() {
  switch (kIsa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kPortable:
      break;
  }
  return "portable";
}

std::vector<int> CpuAdam::bind_threads(const std::vector<int>& pus) {
  PARALLAX_CHECK(!pus.empty(), UsageError, "binding the optimizer's threads needs at least one PU");
  const int threads = at::get_num_threads();
  std::vector<int> bound(static_cast<std::size_t>(threads), -1);
  // One index per thread: the pool gives each of the `threads` workers one.
  intra_op_parallel_for(threads, 1, [&](std::int64_t, std::int64_t) {
    const auto index = static_cast<std::size_t>(intra_op_thread_index());
    const int pu = pus[index % pus.size()];
    bind_calling_thread(pu);
    bound[index] = pu;
  });
  return bound;
}

}  // namespace parallax::offload
