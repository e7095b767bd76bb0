// Bytes of model state one rank holds, by where they live: what the engines account
// (metrics, --explain) and what the planner predicts (planner/model_state.h). No
// dependency beyond the standard library, so planners and tools link it without Torch.
#pragma once

#include <cstdint>

namespace parallax {

/// Bytes of model state one rank actually holds. params, grads and optimizer are
/// where the model computes (the device); host and nvme are what offloading moved
/// there ([offload]): fp32 master shards, gradient shards and moments, or the host
/// buffers the NVMe tier streams them through.
struct ModelStateBytes {
  std::int64_t params = 0;
  std::int64_t grads = 0;
  std::int64_t optimizer = 0;  ///< optimizer state plus fp32 master weights when kept
  std::int64_t host = 0;       ///< offloaded state in host memory
  std::int64_t nvme = 0;       ///< offloaded state in the NVMe tier's files
};

}  // namespace parallax
