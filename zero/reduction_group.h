// Parameters that reduce over another group than the data-parallel one: expert
// parallelism's experts, which only the ranks holding the same experts share
// (core/mesh.h's expert_replicas()). Used by the gradient buckets of replicated data
// parallelism and by ZeRO's flat groups alike: such parameters get buckets (flat groups)
// of their own, reduced (and sharded) over `comm`, and are averaged by the data-parallel
// group's size all the same, since every token of the global batch reached them.
#pragma once

#include <cstddef>
#include <vector>

#include "parallax/core/communicator.h"

namespace parallax::zero {

struct OtherReductionGroup {
  Communicator* comm = nullptr;      ///< the ranks holding the same such parameters
  std::vector<std::size_t> members;  ///< indices into the trained parameters
};

}  // namespace parallax::zero
