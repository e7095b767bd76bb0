// What a run holds and moves, for `train_gpt --explain` and trainers that want the same:
// each rank's model-state bytes (held, and by ZeRO's formulas) and the bytes each of its
// groups (tp, pp, dp) moved, measured by the communicators' own counters.
//
//   std::cout << rt.explain();                   // the plan: placement, groups
//   parallax::GroupTraffic traffic(rt.mesh());   // counters from here on
//   ... one optimizer step ...
//   rt.logger().summary(traffic.report(rt, engine.model_state_bytes(), elements, padding));
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "parallax/core/communicator.h"
#include "parallax/core/config.h"
#include "parallax/core/metrics.h"
#include "parallax/planner/model_state.h"  // model_state_formula

namespace parallax {

class Mesh;
class Runtime;

/// The bytes each of a rank's groups moves, from the moment it is constructed.
class GroupTraffic {
 public:
  /// Snapshots the counters of mesh.tp(), mesh.pp() and mesh.dp(). The mesh must outlive it.
  explicit GroupTraffic(Mesh& mesh);

  /// Payload bytes this rank's tp, pp and dp groups moved since construction (all ops).
  std::array<std::int64_t, 3> bytes_since() const;

  /// Collective over every rank (the runtime's telemetry communicator): a table on rank 0
  /// ("" elsewhere), one row per rank: its model-state bytes `held` beside
  /// model_state_formula(elements, padding, ...) for the run's config, and the bytes its
  /// tp, pp and dp groups moved since construction. Throws CommError.
  std::string report(Runtime& runtime, const ModelStateBytes& held, std::int64_t elements, std::int64_t padding) const;

 private:
  Mesh* mesh_;
  std::array<CommCounters, 3> start_;
};

}  // namespace parallax
