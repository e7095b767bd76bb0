// Measured layer times and machine figures as a file (proto/layer_profile.proto): what an auto run caches
// so the next one on the same machine starts at once, and what `parallax plan
// --profile FILE` plans from instead of the cluster's FLOP rate. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "parallax/planner/plan_search.h"
#include "parallax/planner/transformer_shape.h"

namespace parallax::planner {

/// Layer times and the conditions they were measured under.
struct MeasuredProfile {
  TransformerShape model;
  std::string dtype;    ///< "fp32", "bf16", "fp16"
  std::string machine;  ///< host name, CPU model, logical CPUs, threads per rank
  int world_size = 1;   ///< ranks that computed at once
  int local_size = 1;   ///< of them on the node
  std::string build;    ///< Parallax and LibTorch versions
  LayerTimeTable block, head;
  double memory_bandwidth = 0;  ///< bytes/s per rank (a += b), every rank at once; 0: not measured
  double link_bandwidth = 0;    ///< bytes/s of a ring all-reduce within a node; 0: one rank there
  double link_latency = 0;      ///< seconds per ring hop within a node
  /// The same between nodes (an all-reduce over one rank of each node); 0: one node.
  double inter_node_link_bandwidth = 0;
  double inter_node_link_latency = 0;
  /// Measured / predicted step time of the last runs (at most kRatiosKept, oldest first).
  std::vector<double> step_time_ratios;
  static constexpr std::size_t kRatiosKept = 8;

  /// The median of step_time_ratios (1 when there are none): what the planner's step
  /// times are multiplied by, so the model's steady error on this machine is corrected.
  double step_time_correction() const;
  /// Appends a run's ratio, dropping the oldest beyond kRatiosKept.
  void add_step_time_ratio(double ratio);

  /// Whether `other` was measured under the same conditions (everything but the tables).
  bool same_conditions(const MeasuredProfile& other) const;
  /// "layer-profile-<16 hex digits>.pb": a name that depends on the conditions only.
  std::string file_name() const;
};

/// Reads a profile written by write_profile. Throws ConfigError naming `path` when it
/// cannot be read or is not a layer profile.
MeasuredProfile read_profile(const std::string& path);
/// Writes `profile` to `path` whole or not at all (a temporary file renamed over it),
/// creating its directory. Throws ConfigError naming `path` on failure.
void write_profile(const std::string& path, const MeasuredProfile& profile);

}  // namespace parallax::planner
