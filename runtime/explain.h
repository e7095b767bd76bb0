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

namespace parallax {

class Mesh;
class Runtime;

/// Model-state bytes of one rank by ZeRO's formulas: Ψ = `elements` trainable parameter
/// elements on this rank (its pipeline stage, its tensor-parallel part), Ψ' = Ψ +
/// `padding` (the flat buffers' padding, below dp per buffer), N = `dp`, e = the compute
/// dtype's bytes, k = `optimizer_bytes_per_element` (Adam/AdamW 8, SGD with momentum 4,
/// plain SGD 0, ...), m = 4 bytes of fp32 master per element when e < 4 (else 0):
///   stage 0: params eΨ,    grads 4Ψ (+ eΨ), optimizer (k + m)Ψ
///   stage 1: params eΨ',   grads 4Ψ',   optimizer (k + m)Ψ'/N
///   stage 2: params eΨ',   grads 4Ψ'/N, optimizer (k + m)Ψ'/N
///   stage 3: params eΨ'/N, grads 4Ψ'/N, optimizer (k + m)Ψ'/N
/// (fp32 gradients: reduced and accumulated in fp32 at every precision; at stage 0 a
/// bf16/fp16 parameter's own-dtype gradient is a staging buffer beside them). Not modelled:
/// offload (the optimizer column moves to the host) and stage 3's persistent parameters.
ModelStateBytes model_state_formula(
    std::int64_t elements, std::int64_t padding, int dp, int stage, Dtype dtype, int optimizer_bytes_per_element);

/// Optimizer state bytes per parameter element of `optimizer`: 8 for Adam/AdamW (12 with
/// amsgrad), 4 for SGD with momentum, 0 for plain SGD, 4 for RMSprop (+4 with momentum,
/// +4 centered), 4 for Adagrad.
int optimizer_bytes_per_element(const OptimizerOptions& optimizer);

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
