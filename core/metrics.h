// Per-step metrics as JSON lines (the contract later strategies and the benches read),
// as TensorBoard scalars, and the progress line's duration.
//
// One object per optimizer step, written by rank 0:
//   {"step": 3, "loss": 2.71, "lr": 0.0003, "step_ms": 41.2, "tokens_per_s": 12400.0,
//    "samples_per_s": 48.4, "grad_norm": -1,
//    "model_state_bytes": [{"params": 4096, "grads": 4096, "optimizer": 8192,
//                           "host": 0, "nvme": 0}, ...],
//    "comm": [{"all_reduce": {"calls": 2, "bytes": 4096}, ...}, ...],
//    "bubble_fraction": [0.21, 0.2, ...]}                     (pipeline runs only)
// `model_state_bytes` and `comm` are arrays indexed by world rank. `comm` holds the
// step's activity only; bytes are logical payloads (see communicator.h).
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/model_state_bytes.h"
#include "parallax/core/tensorboard_writer.h"

namespace parallax {

/// What a step's mixture-of-experts layers routed, over the global batch.
struct RoutingMetrics {
  /// MoE layers in the model (over every pipeline stage); 0: none, and no "moe" in the JSON.
  std::int64_t layers = 0;
  /// Mean over the step's layer forwards of aux_loss_coef · balance + z_loss_coef · z:
  /// what the auxiliary losses added to the loss.
  double aux_loss = 0.0;
  double balance_loss = 0.0;      ///< mean unweighted n_experts · Σ f_e·P_e (1: uniform routing)
  double z_loss = 0.0;            ///< mean unweighted logsumexp(logits)²
  double dropped_fraction = 0.0;  ///< choices the capacity rule dropped / every choice
  /// The most imbalanced layer's max / mean tokens per expert (1: balanced).
  double imbalance = 0.0;
};

/// A rank's peak memory in one step (since the step's first forward).
struct PeakMemory {
  /// Bytes of tensors LibTorch's CPU allocator held at once (the runtime's CpuMemoryMeter:
  /// blocks allocated since the runtime started); -1 when not measured (a CUDA device's
  /// caching allocator is not read yet).
  std::int64_t allocated = -1;
  /// The process's resident memory at its most (Linux VmHWM, reset each step); -1 where
  /// the kernel does not tell or refuses the reset.
  std::int64_t resident = -1;
};

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0.0;  ///< mean over the global batch
  double lr = 0.0;
  double step_ms = 0.0;
  /// parallel.mode = "auto": the planner's predicted step time for the chosen layout
  /// (runtime/auto_layout.h); 0 otherwise (not in the JSON line).
  double predicted_step_ms = 0.0;
  /// Global batch tokens per second: samples_per_s × tokens_per_sample, or samples_per_s
  /// when tokens_per_sample is 0.
  double tokens_per_s = 0.0;
  double samples_per_s = 0.0;  ///< global batch samples per second
  /// Tokens in one sample as the trainer set it (Engine::set_tokens_per_sample, e.g. 256);
  /// 0 when it did not (not in the JSON line).
  std::int64_t tokens_per_sample = 0;
  /// Global gradient norm before clipping (unscaled, over every rank's gradients);
  /// -1 when the step computed none (no clipping, no fp16).
  double grad_norm = -1.0;
  std::vector<ModelStateBytes> model_state_bytes;  ///< by world rank
  std::vector<PeakMemory> peak_memory;             ///< by world rank
  std::vector<CommCounters> comm;                  ///< by world rank, this step only
  /// Pipeline runs: by world rank, the fraction of the step's schedule (the longest over
  /// all ranks, from its start to its last forward or backward) the rank did not compute;
  /// empty without a pipeline.
  std::vector<double> bubble_fraction;
  /// Mixture-of-experts routing; moe.layers == 0 without MoE layers.
  RoutingMetrics moe;
};

/// The bytes a rank sent within its node and to other nodes: every op's payload but
/// recv's (a received byte is its sender's), split by OpCounter::inter_node_bytes.
struct NodeSplit {
  std::int64_t intra_node_bytes = 0;
  std::int64_t inter_node_bytes = 0;
};
NodeSplit sent_by_node(const CommCounters& counters);

/// The JSON object for one step, on one line (no trailing newline).
std::string to_json_line(const StepMetrics& metrics);

/// The TensorBoard scalars of one step, in this order (ranks r = 0, 1, …):
///   train/loss, train/lr, train/grad_norm (only when computed: >= 0 or not finite),
///   perf/step_ms, perf/predicted_step_ms (only in auto mode), perf/samples_per_s, perf/tokens_per_s (only when
///   tokens_per_sample is set), memory/rank<r>_bytes (the rank's model state: params + grads + optimizer
///   + host + nvme), memory/rank<r>_peak_allocated_bytes and memory/rank<r>_peak_resident_bytes (each
///   when measured: PeakMemory), comm/<op>_bytes for every op (the step's logical payload bytes
///   summed over all ranks, e.g. comm/all_reduce_bytes), comm/intra_node_bytes and
///   comm/inter_node_bytes (the same payload of every op but recv, whose bytes are the
///   sender's, split by OpCounter::inter_node_bytes; summed over all ranks), and for
///   pipelines
///   pipeline/rank<r>_bubble_fraction.
std::vector<TensorBoardScalar> tensorboard_scalars(const StepMetrics& metrics);

/// A duration for people, for the progress line's ETA: "45s", "1m23s", "2h05m"
/// (seconds rounded; hours without an upper bound, e.g. "50h00m"). Negative or not
/// finite: "?".
std::string human_duration(double seconds);

/// Bytes for people, for the progress line: "512 B", "1.50 KiB", "12.3 MiB", "1.21 GiB"
/// (binary units). Negative: "?".
std::string human_bytes(std::int64_t bytes);

/// Writes each step's metrics to the sinks the user set: a JSON lines file
/// (logging.metrics_file, truncated on open) and/or a TensorBoard event file in a
/// directory (logging.tensorboard_dir). Rank 0 holds the one instance (Runtime).
///
///   MetricsWriter writer("metrics.jsonl", "runs/gpt");
///   writer.write(metrics);  // one JSON line and one TensorBoard event
class MetricsWriter {
 public:
  /// Opens the sinks whose path is not empty. Blocks on the file system. Throws
  /// UsageError naming the key, the path and the reason when one cannot be opened.
  explicit MetricsWriter(const std::string& json_path, const std::string& tensorboard_dir = "");

  /// Writes `metrics` to every sink still open and flushes each. A sink whose write
  /// fails is closed and later calls skip it; once every open sink was tried, the
  /// failures are thrown as one UsageError naming each path. Blocks on the writes.
  void write(const StepMetrics& metrics);

  /// Whether any sink is still open.
  bool open() const { return json_.is_open() || tensorboard_ != nullptr; }

 private:
  std::string json_path_;
  std::ofstream json_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace parallax
