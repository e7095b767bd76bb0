#include "parallax/planner/model_state.h"

#include <algorithm>

namespace parallax {

int dtype_bytes(Dtype dtype) {
  return dtype == Dtype::kFp32 ? 4 : 2;
}

ModelStateBytes model_state_formula(
    std::int64_t elements, std::int64_t padding, int dp, int stage, Dtype dtype, int optimizer_bytes_per_element) {
  const std::int64_t e = dtype_bytes(dtype);
  const std::int64_t per_element = optimizer_bytes_per_element + (e < 4 ? 4 : 0);
  const std::int64_t psi = elements;
  const std::int64_t padded = elements + padding;
  const std::int64_t n = dp;
  ModelStateBytes bytes;
  if (stage == 0) {
    bytes.params = e * psi;
    bytes.grads = (e < 4 ? 4 + e : 4) * psi;  // bf16/fp16: a staging gradient beside the fp32 bucket
    bytes.optimizer = per_element * psi;
    return bytes;
  }
  bytes.params = stage == 3 ? e * padded / n : e * padded;
  bytes.grads = stage == 1 ? 4 * padded : 4 * padded / n;
  bytes.optimizer = per_element * padded / n;
  return bytes;
}

ModelStateBytes model_state_formula(std::int64_t elements,
                                    std::int64_t padding,
                                    int dp,
                                    std::int64_t expert_elements,
                                    std::int64_t expert_padding,
                                    int expert_dp,
                                    int stage,
                                    Dtype dtype,
                                    int optimizer_bytes_per_element) {
  const ModelStateBytes dense = model_state_formula(elements - expert_elements, padding - expert_padding, dp, stage,
                                                    dtype, optimizer_bytes_per_element);
  const ModelStateBytes experts =
      model_state_formula(expert_elements, expert_padding, expert_dp, stage, dtype, optimizer_bytes_per_element);
  ModelStateBytes sum;
  sum.params = dense.params + experts.params;
  sum.grads = dense.grads + experts.grads;
  sum.optimizer = dense.optimizer + experts.optimizer;
  return sum;
}

ModelStateBytes offloaded_model_state_formula(std::int64_t elements,
                                              std::int64_t padding,
                                              int dp,
                                              int stage,
                                              Dtype dtype,
                                              int optimizer_bytes_per_element,
                                              const OffloadOptions& offload) {
  if (offload.optimizer == OffloadTarget::kNone) {
    return model_state_formula(elements, padding, dp, stage, dtype, optimizer_bytes_per_element);
  }
  const std::int64_t e = dtype_bytes(dtype);
  const std::int64_t padded = elements + padding;
  const std::int64_t shard = padded / dp;
  const bool master_in_file = offload.param == OffloadTarget::kNvme;
  ModelStateBytes bytes;
  bytes.params = stage < 3 ? e * padded : offload.param == OffloadTarget::kNone ? e * shard : 0;
  bytes.grads = stage == 1 ? 4 * padded : 0;
  bytes.host = 4 * shard + (master_in_file ? 0 : 4 * shard);
  if (offload.optimizer == OffloadTarget::kNvme) {
    const std::int64_t streams = master_in_file ? 3 : 2;
    const auto buffer_bytes = static_cast<std::int64_t>(offload.buffer_mb * 1024 * 1024);
    const std::int64_t tile = std::max<std::int64_t>(1, std::min(shard, buffer_bytes / (4 * streams)));
    const std::int64_t buffers = std::min<std::int64_t>(offload.buffer_count, (shard + tile - 1) / tile);
    bytes.host += buffers * streams * tile * 4;
    bytes.nvme = streams * 4 * shard;
  } else {
    bytes.host += optimizer_bytes_per_element * shard;
  }
  return bytes;
}

int optimizer_bytes_per_element(const OptimizerOptions& optimizer) {
  const int momentum = optimizer.momentum != 0.0 ? 4 : 0;
  switch (optimizer.type) {
    case OptimizerType::kSgd:
      return momentum;
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      return optimizer.amsgrad ? 12 : 8;
    case OptimizerType::kRmsprop:
      return 4 + momentum + (optimizer.centered ? 4 : 0);
    case OptimizerType::kAdagrad:
      return 4;
  }
  return 8;
}

}  // namespace parallax
