#include "parallax/core/mesh.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

// The rank that plain rank arithmetic puts at a coordinate: tp + T·(dp + D·pp), or
// tp + T·(pp + P·dp) with data parallelism outermost.
int linear_index(const MeshDegrees& d, AxisOrder order, const MeshCoord& c) {
  if (order == AxisOrder::kTpPpDp) return c.tp + d.tp * (c.pp + d.pp * c.dp);
  return c.tp + d.tp * (c.dp + d.dp * c.pp);
}

MeshCoord coord_of_index(const MeshDegrees& d, AxisOrder order, int index) {
  MeshCoord c;
  c.tp = index % d.tp;
  const int group = index / d.tp;  // TP group number
  if (order == AxisOrder::kTpPpDp) {
    c.pp = group % d.pp;
    c.dp = group / d.pp;
  } else {
    c.dp = group % d.dp;
    c.pp = group / d.dp;
  }
  return c;
}

// The coordinate along `axis`, and the degree of that axis.
int along(MeshAxis axis, const MeshCoord& c) {
  switch (axis) {
    case MeshAxis::kTp:
      return c.tp;
    case MeshAxis::kPp:
      return c.pp;
    case MeshAxis::kDp:
      return c.dp;
  }
  return 0;
}

int degree(MeshAxis axis, const MeshDegrees& d) {
  switch (axis) {
    case MeshAxis::kTp:
      return d.tp;
    case MeshAxis::kPp:
      return d.pp;
    case MeshAxis::kDp:
      return d.dp;
  }
  return 1;
}

MeshCoord with(MeshAxis axis, MeshCoord c, int value) {
  switch (axis) {
    case MeshAxis::kTp:
      c.tp = value;
      break;
    case MeshAxis::kPp:
      c.pp = value;
      break;
    case MeshAxis::kDp:
      c.dp = value;
      break;
  }
  return c;
}

// True when each node's ranks are consecutive (the launcher placed them by slot) and
// every TP group of consecutive ranks lies within one node: then rank arithmetic keeps
// the inner axes' groups on as few nodes as the per-node cut would.
bool arithmetic_fits_nodes(const Cluster& cluster, int tp) {
  std::vector<bool> seen(static_cast<std::size_t>(cluster.num_nodes()), false);
  for (int rank = 0; rank < cluster.world_size(); ++rank) {
    const int node = cluster.node_of(rank);
    const bool same_as_previous = rank > 0 && node == cluster.node_of(rank - 1);
    if (!same_as_previous && seen[static_cast<std::size_t>(node)])
      return false;                                         // the node's ranks are not consecutive
    if (rank % tp != 0 && !same_as_previous) return false;  // a TP group would cross nodes
    seen[static_cast<std::size_t>(node)] = true;
  }
  return true;
}

}  // namespace

bool operator==(const MeshCoord& a, const MeshCoord& b) {
  return a.tp == b.tp && a.pp == b.pp && a.dp == b.dp;
}
bool operator!=(const MeshCoord& a, const MeshCoord& b) {
  return !(a == b);
}

const char* to_string(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kTp:
      return "tp";
    case MeshAxis::kPp:
      return "pp";
    case MeshAxis::kDp:
      return "dp";
  }
  return "?";
}

void check_degrees(const MeshDegrees& d, int world_size) {
  PARALLAX_CHECK(d.tp >= 1 && d.pp >= 1 && d.dp >= 1, ConfigError, "parallel degrees must be >= 1, got tp = ", d.tp,
                 ", pp = ", d.pp, ", dp = ", d.dp);
  PARALLAX_CHECK(static_cast<long long>(d.tp) * d.pp * d.dp == world_size, ConfigError,
                 "tp × pp × dp must equal the world size: tp = ", d.tp, ", pp = ", d.pp, ", dp = ", d.dp, " gives ",
                 static_cast<long long>(d.tp) * d.pp * d.dp, " ranks but the world has ", world_size);
}

// --- MeshLayout ---------------------------------------------------------------------------

MeshLayout::MeshLayout(MeshDegrees degrees, AxisOrder order, std::vector<MeshCoord> coords, bool rank_arithmetic)
    : degrees_(degrees),
      order_(order),
      coords_(std::move(coords)),
      rank_at_(coords_.size(), -1),
      rank_arithmetic_(rank_arithmetic) {
  for (int rank = 0; rank < world_size(); ++rank) {
    int& slot = rank_at_[linear_index(degrees_, order_, coords_[rank])];
    PARALLAX_ASSERT(slot == -1, "two ranks placed at one coordinate");
    slot = rank;
  }
}

MeshLayout MeshLayout::place(const Cluster& cluster, const MeshDegrees& degrees, AxisOrder order) {
  const int world = cluster.world_size();
  check_degrees(degrees, world);
  std::vector<MeshCoord> coords(world);
  if (arithmetic_fits_nodes(cluster, degrees.tp)) {
    for (int rank = 0; rank < world; ++rank) coords[rank] = coord_of_index(degrees, order, rank);
    return MeshLayout(degrees, order, std::move(coords), /*rank_arithmetic=*/true);
  }
  // Cut each node's ranks into TP groups; number the groups node by node.
  int group = 0;
  for (int node = 0; node < cluster.num_nodes(); ++node) {
    const std::vector<int>& ranks = cluster.ranks_on(node);
    const int count = static_cast<int>(ranks.size());
    const std::string& host = cluster.nodes()[node].hostname;
    PARALLAX_CHECK(count >= degrees.tp, TopologyError,
                   "cannot keep tensor-parallel groups within nodes: tp = ", degrees.tp, " needs ", degrees.tp,
                   " ranks on one node, but node '", host, "' hosts ranks ", format_rank_set(ranks), " (", count,
                   "). Lower parallel.tp to at most ", count, ", or start ", degrees.tp,
                   " ranks on every node (mpirun --map-by ppr:", degrees.tp, ":node, srun --ntasks-per-node=",
                   degrees.tp, ")");
    PARALLAX_CHECK(count % degrees.tp == 0, TopologyError,
                   "cannot keep tensor-parallel groups within nodes: tp = ", degrees.tp,
                   " must divide the ranks of every node, but node '", host, "' hosts ranks ", format_rank_set(ranks),
                   " (", count, ", not a multiple of ", degrees.tp, "). Start a multiple of ", degrees.tp,
                   " ranks on every node (mpirun --map-by ppr:N:node, srun --ntasks-per-node=N), or choose a tp "
                   "that divides ", count);
    for (int i = 0; i < count; ++i) {
      coords[ranks[i]] = coord_of_index(degrees, order, group * degrees.tp + i % degrees.tp);
      if (i % degrees.tp == degrees.tp - 1) ++group;
    }
  }
  return MeshLayout(degrees, order, std::move(coords), /*rank_arithmetic=*/false);
}

const MeshCoord& MeshLayout::coord(int rank) const {
  PARALLAX_CHECK(rank >= 0 && rank < world_size(), UsageError, "rank ", rank, " is outside the mesh's ", world_size(),
                 " ranks");
  return coords_[rank];
}

int MeshLayout::rank_at(const MeshCoord& c) const {
  PARALLAX_CHECK(c.tp >= 0 && c.tp < degrees_.tp && c.pp >= 0 && c.pp < degrees_.pp && c.dp >= 0 && c.dp < degrees_.dp,
                 UsageError, "coordinate (tp = ", c.tp, ", pp = ", c.pp, ", dp = ", c.dp,
                 ") is outside the mesh tp = ", degrees_.tp, ", pp = ", degrees_.pp, ", dp = ", degrees_.dp);
  return rank_at_[linear_index(degrees_, order_, c)];
}

int MeshLayout::color(MeshAxis axis, int rank) const {
  const MeshCoord& c = coord(rank);
  switch (axis) {
    case MeshAxis::kTp:
      return c.pp * degrees_.dp + c.dp;
    case MeshAxis::kDp:
      return c.tp * degrees_.pp + c.pp;
    case MeshAxis::kPp:
      return c.tp * degrees_.dp + c.dp;
  }
  return 0;
}

std::vector<int> MeshLayout::group(MeshAxis axis, int rank) const {
  const MeshCoord& c = coord(rank);
  std::vector<int> ranks;
  for (int i = 0; i < degree(axis, degrees_); ++i) ranks.push_back(rank_at(with(axis, c, i)));
  return ranks;
}

std::vector<std::vector<int>> MeshLayout::groups(MeshAxis axis) const {
  std::vector<std::vector<int>> result(world_size() / degree(axis, degrees_));
  for (int rank = 0; rank < world_size(); ++rank) {
    if (along(axis, coords_[rank]) == 0) result[color(axis, rank)] = group(axis, rank);
  }
  return result;
}

std::string MeshLayout::group_name(MeshAxis axis, int rank) const {
  const MeshCoord& c = coord(rank);
  std::ostringstream out;
  switch (axis) {
    case MeshAxis::kTp:
      out << "tp[pp=" << c.pp << ",dp=" << c.dp << ']';
      break;
    case MeshAxis::kDp:
      out << "dp[tp=" << c.tp << ",pp=" << c.pp << ']';
      break;
    case MeshAxis::kPp:
      out << "pp[tp=" << c.tp << ",dp=" << c.dp << ']';
      break;
  }
  return out.str();
}

std::string MeshLayout::describe(const Cluster& cluster) const {
  PARALLAX_CHECK(cluster.world_size() == world_size(), UsageError, "describing a mesh of ", world_size(),
                 " ranks with a cluster of ", cluster.world_size());
  std::size_t host_width = 4;
  for (const auto& node : cluster.nodes()) host_width = std::max(host_width, node.hostname.size());
  std::ostringstream out;
  out << "mesh: tp = " << degrees_.tp << ", pp = " << degrees_.pp << ", dp = " << degrees_.dp << " (order "
      << to_string(order_) << ") over " << world_size() << " ranks on " << cluster.num_nodes()
      << (cluster.num_nodes() == 1 ? " node" : " nodes") << "; TP groups "
      << (rank_arithmetic_ ? "by rank arithmetic" : "cut per node (ranks not node-contiguous)") << '\n';
  out << "  rank  " << std::left << std::setw(static_cast<int>(host_width)) << "host" << std::right
      << "  local  tp  pp  dp\n";
  for (int rank = 0; rank < world_size(); ++rank) {
    const RankLocation& at = cluster.location(rank);
    const MeshCoord& c = coords_[rank];
    out << std::setw(6) << rank << "  " << std::left << std::setw(static_cast<int>(host_width))
        << cluster.nodes()[at.node].hostname << std::right << std::setw(7) << at.local << std::setw(4) << c.tp
        << std::setw(4) << c.pp << std::setw(4) << c.dp << '\n';
  }
  for (MeshAxis axis : {MeshAxis::kTp, MeshAxis::kPp, MeshAxis::kDp}) {
    out << "  " << to_string(axis) << " groups:";
    for (const auto& ranks : groups(axis)) out << ' ' << format_rank_set(ranks);
    out << '\n';
  }
  return out.str();
}

// --- Mesh ---------------------------------------------------------------------------------

namespace {

// The nodes of `ranks` (world ranks), for Communicator::set_member_nodes.
std::vector<int> nodes_of(const Cluster& cluster, const std::vector<int>& ranks) {
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (int rank : ranks) nodes.push_back(cluster.node_of(rank));
  return nodes;
}

std::unique_ptr<Communicator> split_along(Communicator& world,
                                          const Cluster& cluster,
                                          const MeshLayout& layout,
                                          MeshAxis axis) {
  const int rank = world.rank();
  auto comm = world.split(layout.color(axis, rank), along(axis, layout.coord(rank)), layout.group_name(axis, rank));
  const int expected = degree(axis, layout.degrees());
  PARALLAX_ASSERT(comm != nullptr && comm->size() == expected, "group ", layout.group_name(axis, rank), " has ",
                  comm ? comm->size() : 0, " ranks, expected ", expected);
  comm->set_member_nodes(nodes_of(cluster, layout.group(axis, rank)));
  return comm;
}

MeshLayout checked_layout(const Communicator& world,
                          const Cluster& cluster,
                          const MeshDegrees& degrees,
                          AxisOrder order) {
  PARALLAX_CHECK(cluster.world_size() == world.size(), UsageError, "the cluster describes ", cluster.world_size(),
                 " ranks but the communicator '", world.name(), "' has ", world.size());
  return MeshLayout::place(cluster, degrees, order);
}

}  // namespace

Mesh::Mesh(Communicator& world, Cluster cluster, const MeshDegrees& degrees, AxisOrder order)
    : world_(&world), cluster_(std::move(cluster)), layout_(checked_layout(world, cluster_, degrees, order)) {
  std::vector<int> everyone(static_cast<std::size_t>(world.size()));
  for (int rank = 0; rank < world.size(); ++rank) everyone[static_cast<std::size_t>(rank)] = rank;
  world.set_member_nodes(nodes_of(cluster_, everyone));
  // Same order on every rank: each split is a collective over the world.
  tp_ = split_along(world, cluster_, layout_, MeshAxis::kTp);
  dp_ = split_along(world, cluster_, layout_, MeshAxis::kDp);
  pp_ = split_along(world, cluster_, layout_, MeshAxis::kPp);
}

Communicator& Mesh::group(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kTp:
      return *tp_;
    case MeshAxis::kPp:
      return *pp_;
    case MeshAxis::kDp:
      return *dp_;
  }
  return *tp_;
}

std::string Mesh::describe() const {
  const MeshCoord& c = coord();
  std::ostringstream out;
  out << "this rank: world " << world_->rank() << " at tp = " << c.tp << ", pp = " << c.pp << ", dp = " << c.dp << '\n'
      << layout_.describe(cluster_);
  return out.str();
}

}  // namespace parallax
