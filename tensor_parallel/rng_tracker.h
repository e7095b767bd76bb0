// Random streams for tensor parallelism: dropout on a replicated activation must drop
// the same elements on every rank of the tensor-parallel group, and dropout on a
// sharded activation (a rank's own heads or columns) must draw independently per rank.
//
// The default generator serves replicated regions: it is seeded alike on every rank
// (train.seed) and advanced alike, because every rank runs the same operators on it.
// The tracker keeps named streams besides it, seeded per rank; inside a fork() scope
// the default generator draws from the named stream instead, and leaves it advanced.
// Each stream is reproducible from its seed, so two runs draw the same numbers.
// Recomputation: capture() before a region and restore() before running it again
// replays the same draws on every stream.
//
//   RngTracker rng;  rng.add(kSplitStream, seed + 2718 + tp_rank);   // Runtime::rng_tracker() has it
//   { auto split = rng.fork(kSplitStream); h = torch::dropout(h, p, true); }
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace parallax::tensor_parallel {

/// The stream the runtime seeds per tensor-parallel rank for split activations.
inline constexpr const char* kSplitStream = "tensor-parallel";

class RngTracker {
 public:
  /// A new stream `name` seeded with `seed`. Throws UsageError when it exists.
  void add(const std::string& name, std::uint64_t seed);

  /// While the returned scope lives, LibTorch's default CPU generator draws from stream
  /// `name`; on exit the stream keeps its advanced state and the default generator gets
  /// its own back. Throws UsageError for an unknown name. Not reentrant for one name.
  class Fork {
   public:
    Fork(RngTracker& tracker, const std::string& name);
    Fork(const Fork&) = delete;
    Fork& operator=(const Fork&) = delete;
    ~Fork();

   private:
    RngTracker* tracker_;
    std::string name_;
    torch::Tensor outside_;  ///< the default generator's state at entry
  };
  Fork fork(const std::string& name) { return Fork(*this, name); }

  /// The states of the default generator and of every stream, and their restoration
  /// (for activation recomputation).
  struct Snapshot {
    torch::Tensor default_state;
    std::map<std::string, torch::Tensor> streams;
  };
  Snapshot capture() const;
  void restore(const Snapshot& snapshot);

 private:
  std::map<std::string, torch::Tensor> streams_;  ///< generator states (uint8)
};

}  // namespace parallax::tensor_parallel
