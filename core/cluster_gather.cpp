// Cluster::gather, the one collective of topology.h, apart from the pure parsing in
// topology.cpp so that the parsers build (and are fuzzed) without LibTorch.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "parallax/core/communicator.h"
#include "parallax/core/topology.h"

namespace parallax {

Cluster Cluster::gather(Communicator& world, const NodeTopology& self) {
  const std::string bytes = self.serialize();
  const int size = world.size();
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(bytes.size()), at::kLong);
  at::Tensor lengths = at::empty({size}, at::kLong);
  world.all_gather(lengths, length)->wait();
  // At least one byte per rank: a zero-sized all_gather helps nobody.
  const std::int64_t width = std::max<std::int64_t>(1, lengths.max().item<std::int64_t>());
  at::Tensor mine = at::zeros({width}, at::kByte);
  std::memcpy(mine.data_ptr<std::uint8_t>(), bytes.data(), bytes.size());
  at::Tensor all = at::empty({size * width}, at::kByte);
  world.all_gather(all, mine)->wait();

  const auto* data = all.data_ptr<std::uint8_t>();
  const auto* lens = lengths.data_ptr<std::int64_t>();
  std::vector<NodeTopology> per_rank;
  per_rank.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    const char* start = reinterpret_cast<const char*>(data + rank * width);
    per_rank.push_back(NodeTopology::parse(std::string(start, static_cast<std::size_t>(lens[rank]))));
  }
  return from_rank_topologies(per_rank);
}

}  // namespace parallax
