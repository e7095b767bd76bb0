// LibTorch's default CPU generator, read and written under its lock: the one place the
// library saves, seeds and restores it (layer seeding, dropout streams, recomputation).
//
//   {
//     parallax::RestoreCpuGenerator restore;      // the state now
//     parallax::seed_cpu_generator(42);
//     auto layer = build();                       // draws from seed 42
//   }                                             // back to the state before
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <mutex>

namespace parallax {

/// The state of `generator` (default: LibTorch's default CPU generator), a byte tensor.
inline at::Tensor cpu_generator_state(at::Generator generator = at::detail::getDefaultCPUGenerator()) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

/// Sets the default CPU generator to `state` (from cpu_generator_state()).
inline void set_cpu_generator_state(const at::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

/// Reseeds the default CPU generator.
inline void seed_cpu_generator(std::uint64_t seed) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
}

/// Saves the default CPU generator's state and puts it back when destroyed (also when
/// an exception passes).
class RestoreCpuGenerator {
 public:
  RestoreCpuGenerator() : saved_(cpu_generator_state()) {}
  RestoreCpuGenerator(const RestoreCpuGenerator&) = delete;
  RestoreCpuGenerator& operator=(const RestoreCpuGenerator&) = delete;
  ~RestoreCpuGenerator() { set_cpu_generator_state(saved_); }

 private:
  at::Tensor saved_;
};

}  // namespace parallax
