// What context-parallel attention did on this rank, counted exactly; the caller owns the
// counters and passes them in the options of each call.
#pragma once

#include <cstdint>

namespace parallax::context_parallel {

struct AttentionCounters {
  /// Forward attention calls.
  std::int64_t calls = 0;
  /// Query–key scores the forwards computed: batch × query heads × rows × columns of
  /// every score block (e.g. 2 × 8 × 512 × 1024). The attention work of this rank; under
  /// a causal mask it differs between ranks unless the sequence split is load-balanced.
  std::int64_t score_elements = 0;
};

}  // namespace parallax::context_parallel
