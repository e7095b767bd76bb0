// Measured layer times and machine figures as a file (proto/layer_profile.proto): what an auto run caches
// so the next one on the same machine starts at once, and what `parallax plan
// --profile FILE` plans from instead of the cluster's FLOP rate. Torch-free.
#pragma once

#include <string>

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
  double link_bandwidth = 0;    ///< bytes/s of a ring all-reduce over the world; 0: one rank
  double link_latency = 0;      ///< seconds per ring hop

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
