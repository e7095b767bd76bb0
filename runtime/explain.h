// What a run holds and moves, for `train_gpt --explain` and trainers that want the same:
// each rank's model-state bytes (held, and by ZeRO's formulas), the bytes each of its
// groups (tp, pp, the replicas: dp, or dp × cp; cp) moved, measured by the communicators'
// own counters, and how many of them reached other nodes (OpCounter::inter_node_bytes).
//
//   std::cout << rt.explain();                   // the plan: placement, groups
//   parallax::GroupTraffic traffic(rt);          // counters from here on
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

/// Bytes per group: tp, pp, the replicas (dp × cp: the gradient reduction and ZeRO's
/// shards; dp itself at cp = 1), and cp (context-parallel attention).
using GroupBytes = std::array<std::int64_t, 4>;

/// The bytes each of a rank's groups moves, from the moment it is constructed.
class GroupTraffic {
 public:
  /// Snapshots the counters of the runtime's tp, pp, replica, cp and world groups. The
  /// runtime must outlive it.
  explicit GroupTraffic(Runtime& runtime);

  /// Payload bytes this rank's groups moved since construction (all ops).
  GroupBytes bytes_since() const;
  /// Of those, the bytes that reached another node (OpCounter::inter_node_bytes).
  GroupBytes inter_node_bytes_since() const;

  /// Collective over every rank (the runtime's telemetry communicator): a table on rank 0
  /// ("" elsewhere), one row per rank: its model-state bytes `held` beside
  /// model_state_formula(elements, padding, ...) for the run's config (shards over the
  /// replicas), and the bytes its groups moved since construction, each with the part
  /// that reached another node in parentheses (a cp column only when parallel.cp > 1). On a cluster of several nodes a second table follows:
  /// the bytes each rank sent within its node and to other nodes (every op but recv, over
  /// the tp, pp, replica, cp and world groups). Throws CommError.
  std::string report(Runtime& runtime, const ModelStateBytes& held, std::int64_t elements, std::int64_t padding) const;

 private:
  Runtime* runtime_;
  std::array<CommCounters, 5> start_;  // tp, pp, replicas, cp, world
};

}  // namespace parallax
