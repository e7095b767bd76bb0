// parallel.mode = "auto": the run chooses its own layout with the planner
// (planner/plan_search.h) before anything is split or built.
//
// The keys the config sets are constraints, never changed: parallel.tp, .pp, .dp,
// zero.stage, offload.optimizer, offload.param, pipeline.schedule, .virtual_stages,
// .recompute, train.micro_batch_size and train.grad_accum; the planner chooses every
// other. A key set to "auto" (Config::auto_keys) is the planner's in either mode; in
// manual mode the planner chooses only those, every other layout key kept as it is. It needs the model's shape (a [model] table in the GPT example's keys:
// n_layer, d_model, n_head, vocab_size, block_size) and train.global_batch_size.
//
// The cluster is this one: nodes and ranks per node from the world (or [topology]'s
// emulated nodes), each rank a device with its share of the host's memory, its compute
// rate from a matrix multiply timed here, its memory bandwidth from a timed add, and its
// links from all-reduces timed here; the model's own block and head are timed at every
// micro-batch and tensor-parallel split a plan may use (layer_profile.h).
// Rank 0's measurements are broadcast, so every rank plans with the same figures and
// chooses the same layout.
#pragma once

#include <string>

#include "parallax/core/config.h"

namespace parallax {

class World;

struct AutoLayout {
  /// What rank 0 prints: the machine as measured, the choice with its predicted memory
  /// and time, the runners-up and the rejected families. Empty when not in auto mode.
  std::string explanation;
  /// The chosen layout's predicted memory per rank (its largest stage: model state,
  /// activations, buffers), and this rank's resident bytes before planning: the run's end
  /// compares the growth of its peak resident memory with the prediction. 0 when not in
  /// auto mode.
  std::int64_t predicted_bytes = 0;
  std::int64_t resident_bytes = 0;
  /// The planner's step time before the correction, the correction (the layer-time
  /// file's measured / model ratios), and the file the run's end records its own ratio
  /// in ("" when none is kept).
  double model_step_ms = 0.0;
  double step_time_correction = 1.0;
  std::string profile_file;

  /// The chosen layout's predicted step time: every auto run's metrics carry it beside
  /// the measured one, and its end compares them. 0 when not in auto mode.
  double predicted_step_ms() const { return model_step_ms * step_time_correction; }
};

/// The malloc this process runs on. glibc's keeps freed large buffers resident once its
/// mmap threshold has risen, so its peak resident memory exceeds the live tensors (see
/// docs/planner.md).
enum class Malloc { kGlibc, kTcmalloc, kJemalloc };
Malloc this_malloc();
/// "glibc malloc", "tcmalloc", "jemalloc".
const char* to_string(Malloc malloc);
/// Gives this_malloc()'s free memory back to the system.
void release_free_memory();

/// When `config` says parallel.mode = "auto", or has "auto" keys: sets its layout keys to the planner's
/// choice (mode manual; the chosen keys' positions say so). Otherwise changes nothing
/// and returns an empty AutoLayout. Collective over `world`. Throws ConfigError when
/// the model's shape or the batch is missing, or when no layout meets the constraints
/// (naming them and the nearest).
AutoLayout choose_auto_layout(Config& config, World& world);

}  // namespace parallax
