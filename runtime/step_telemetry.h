// Per-step bookkeeping shared by the engines: timing, the loss over the global batch,
// per-rank model-state bytes and communication counters, the metrics file and the
// progress line.
//
// Protocol at the end of each optimizer step (collective over all ranks):
//  1. Each rank packs [local mean loss, params, grads, optimizer bytes, its peak memory
//     since the step's first forward (LibTorch's allocated bytes, resident bytes), for
//     each op kind the calls, bytes and inter-node bytes its training communicators did
//     during the step].
//  2. One all_gather on the runtime's telemetry communicator (not counted in the
//     training groups' counters).
//  3. Every rank computes the global mean loss (the mean of the ranks' means: every
//     rank's micro-batches are equal in size); rank 0 writes the metrics (JSON line,
//     TensorBoard event) and, every `logging.every` steps, the progress line:
//       step 20/100 | loss 2.7100 | lr 3.000e-04 | 41.2 ms/step | 12.4k tok/s | peak mem 195 MiB (tensors 6.96 MiB) | ETA 3s
//     (samples/s unless the trainer set tokens per sample; the ETA is the remaining
//     steps times the mean step time so far without this object's first step, which
//     holds the warm-up, so the first line has none). A failed write is logged once and
//     closes that sink (the JSON file or the TensorBoard file); it does not stop
//     training.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallax/core/metrics.h"
#include "parallax/runtime/runtime.h"

namespace parallax {
namespace proto {
class Plan;
}

class StepTelemetry {
 public:
  /// `plan`: the engine's (its global batch and run length); it must outlive this.
  StepTelemetry(Runtime& runtime, const proto::Plan& plan);
  ~StepTelemetry();

  /// Marks the start of an accumulation window (the step timer) if none is open: the
  /// first forward or backward of an optimizer step.
  void begin_window_if_needed();
  /// Closes the window: the collective above. Returns the step's metrics.
  StepMetrics end_window(
      std::int64_t step, double local_loss, double lr, double grad_norm, const ModelStateBytes& state);

  /// Tokens in one sample (e.g. the GPT example's block size): the progress line then
  /// shows tok/s, and the metrics carry tokens_per_sample. Unset: samples/s.
  void set_tokens_per_sample(std::int64_t tokens) { tokens_per_sample_ = tokens; }
  /// A pipeline stage's activity in the window: milliseconds of forward/backward compute
  /// and from the schedule's start to its last compute. The next end_window reports each
  /// rank's bubble fraction, 1 − compute / the longest schedule over all ranks.
  void set_pipeline_activity(double compute_ms, double schedule_ms) {
    compute_ms_ = compute_ms;
    schedule_ms_ = schedule_ms;
  }
  /// What this rank's MoE layers routed in the window (sums over its layers' forwards,
  /// and its worst layer's imbalance over the global batch); the next end_window
  /// combines every rank's into StepMetrics::moe.
  struct RoutingActivity {
    std::int64_t layers = 0;  ///< this rank's MoE layers
    std::int64_t forwards = 0;
    double aux_loss = 0.0;  ///< sums over forwards
    double balance_loss = 0.0;
    double z_loss = 0.0;
    std::int64_t choices = 0;
    std::int64_t dropped = 0;
    double imbalance = 0.0;
  };
  void set_routing_activity(const RoutingActivity& activity) { routing_ = activity; }

 private:
  CommCounters training_counters() const;

  Runtime& runtime_;
  TrainOptions batch_;  ///< the plan's batch: global batch (samples per step) and steps
  std::vector<Communicator*> training_comms_;
  CommCounters counters_at_start_;
  bool window_open_ = false;
  bool resident_peak_reset_ = false;  ///< this window's resident peak is its own (reset_resident_peak)
  std::int64_t run_resident_peak_ = -1;  ///< since planning (auto mode's memory check), over every window
  std::chrono::steady_clock::time_point window_start_;
  std::int64_t tokens_per_sample_ = 0;  // 0: not set (samples/s)
  bool first_window_done_ = false;      // the first window (warm-up) is not in the ETA's mean
  double timed_ms_ = 0.0;               // the other windows' total time and count
  std::int64_t timed_windows_ = 0;
  RoutingActivity routing_;   // this window's (zero without MoE layers)
  double compute_ms_ = -1.0;  // -1: no pipeline activity this window
  double schedule_ms_ = -1.0;
};

}  // namespace parallax
