// Cluster::gather, the one collective of topology.h, apart from the pure parsing in
// topology.cpp so that the parsers build (and are fuzzed) without LibTorch.
#include "parallax/core/communicator.h"
#include "parallax/core/topology.h"

namespace parallax {

Cluster Cluster::gather(Communicator& world, const NodeTopology& self) {
  std::vector<NodeTopology> per_rank;
  for (const std::string& bytes : all_gather_strings(world, self.serialize())) {
    per_rank.push_back(NodeTopology::parse(bytes));
  }
  return from_rank_topologies(per_rank);
}

}  // namespace parallax
