// The options every context-parallel attention takes, and the counters it fills.
#pragma once

#include <cstdint>

namespace parallax::context_parallel {

/// How attention crosses the context-parallel group ([context_parallel] method).
enum class AttentionMethod {
  /// Key/value blocks circulate around the group (ring_attention.h): any head count;
  /// cp − 1 point-to-point hops per layer, each overlapped with a block's attention.
  kRing,
  /// Ulysses (all_to_all_attention.h): the sequence-split activations are exchanged
  /// for head-split ones, attention runs whole per head, and the output is exchanged
  /// back. The heads (and key/value heads) must divide by cp.
  kAllToAll,
};
/// "ring", "all_to_all".
const char* to_string(AttentionMethod method);

/// What context-parallel attention did on this rank, counted exactly.
struct AttentionCounters {
  /// Forward attention calls.
  std::int64_t calls = 0;
  /// Query–key scores the forwards computed: batch × query heads × rows × columns of
  /// every score block (e.g. 2 × 8 × 512 × 1024). The attention work of this rank; under
  /// a causal mask the ring's differs between ranks unless the sequence split is
  /// load-balanced.
  std::int64_t score_elements = 0;
};

struct AttentionOptions {
  /// Ring or all-to-all; read by context_attention() only. Default: ring.
  AttentionMethod method = AttentionMethod::kRing;
  /// Each query attends only to keys at or before its position. Default: true.
  bool causal = true;
  /// Multiplies the scores; 0 means 1/√head_dim. Default: 0.
  double scale = 0;
  /// Where to count this call's work, or null (the caller owns them). Default: null.
  AttentionCounters* counters = nullptr;
};

}  // namespace parallax::context_parallel
