// Per-step metrics as JSON lines: the contract later strategies and the benches read.
//
// One object per optimizer step, written by rank 0:
//   {"step": 3, "loss": 2.71, "lr": 0.0003, "step_ms": 41.2, "tokens_per_s": 12400.0,
//    "model_state_bytes": [{"params": 4096, "grads": 4096, "optimizer": 8192,
//                           "host": 0, "nvme": 0}, ...],
//    "comm": [{"all_reduce": {"calls": 2, "bytes": 4096}, ...}, ...],
//    "bubble_fraction": [0.21, 0.2, ...]}                     (pipeline runs only)
// `model_state_bytes` and `comm` are arrays indexed by world rank. `comm` holds the
// step's activity only; bytes are logical payloads (see communicator.h).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"

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

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0.0;  ///< mean over the global batch
  double lr = 0.0;
  double step_ms = 0.0;
  double tokens_per_s = 0.0;
  /// Global gradient norm before clipping (unscaled, over every rank's gradients);
  /// -1 when the step computed none (no clipping, no fp16).
  double grad_norm = -1.0;
  std::vector<ModelStateBytes> model_state_bytes;  ///< by world rank
  std::vector<CommCounters> comm;                  ///< by world rank, this step only
  /// Pipeline runs: by world rank, the fraction of the step's schedule (the longest over
  /// all ranks, from its start to its last forward or backward) the rank did not compute;
  /// empty without a pipeline.
  std::vector<double> bubble_fraction;
};

/// The JSON object for one step, on one line (no trailing newline).
std::string to_json_line(const StepMetrics& metrics);

/// Appends JSON lines to a file (truncated on open).
class MetricsWriter {
 public:
  /// Throws UsageError naming the path if it cannot be opened.
  explicit MetricsWriter(const std::string& path);
  void write(const StepMetrics& metrics);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace parallax
