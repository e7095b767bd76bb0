#include "parallax/core/mesh.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

// The rank that plain rank arithmetic puts at a coordinate: the coordinates read as one
// number over inner_to_outer(order), innermost least significant.
int linear_index(const MeshDegrees& d, AxisOrder order, const MeshCoord& c) {
  const auto axes = inner_to_outer(order);
  int index = 0;
  for (auto axis = axes.rbegin(); axis != axes.rend(); ++axis) index = index * d.of(*axis) + c.of(*axis);
  return index;
}

MeshCoord coord_of_index(const MeshDegrees& d, AxisOrder order, int index) {
  MeshCoord c;
  for (MeshAxis axis : inner_to_outer(order)) {
    c.set(axis, index % d.of(axis));
    index /= d.of(axis);
  }
  return c;
}

// cp appears in names and tables only where it splits something, so a mesh without
// context parallelism reads as before the axis existed.
bool shown(MeshAxis axis, const MeshDegrees& d) {
  return axis != MeshAxis::kCp || d.cp > 1;
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

int MeshDegrees::of(MeshAxis axis) const {
  switch (axis) {
    case MeshAxis::kTp:
      return tp;
    case MeshAxis::kCp:
      return cp;
    case MeshAxis::kPp:
      return pp;
    case MeshAxis::kDp:
      return dp;
  }
  return 1;
}

int MeshDegrees::of(const MeshAxes& axes) const {
  int size = 1;
  for (MeshAxis axis : kMeshAxes) {
    if (axes.contains(axis)) size *= of(axis);
  }
  return size;
}

int MeshCoord::of(MeshAxis axis) const {
  switch (axis) {
    case MeshAxis::kTp:
      return tp;
    case MeshAxis::kCp:
      return cp;
    case MeshAxis::kPp:
      return pp;
    case MeshAxis::kDp:
      return dp;
  }
  return 0;
}

void MeshCoord::set(MeshAxis axis, int value) {
  switch (axis) {
    case MeshAxis::kTp:
      tp = value;
      return;
    case MeshAxis::kCp:
      cp = value;
      return;
    case MeshAxis::kPp:
      pp = value;
      return;
    case MeshAxis::kDp:
      dp = value;
      return;
  }
}

bool operator==(const MeshCoord& a, const MeshCoord& b) {
  return a.tp == b.tp && a.pp == b.pp && a.dp == b.dp && a.cp == b.cp;
}
bool operator!=(const MeshCoord& a, const MeshCoord& b) {
  return !(a == b);
}

const char* to_string(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kTp:
      return "tp";
    case MeshAxis::kCp:
      return "cp";
    case MeshAxis::kPp:
      return "pp";
    case MeshAxis::kDp:
      return "dp";
  }
  return "?";
}

std::string to_string(const MeshAxes& axes) {
  std::string name;
  for (MeshAxis axis : kMeshAxes) {
    if (!axes.contains(axis)) continue;
    if (!name.empty()) name += '+';
    name += to_string(axis);
  }
  return name;
}

std::array<MeshAxis, 4> inner_to_outer(AxisOrder order) {
  if (order == AxisOrder::kTpPpDp) return {MeshAxis::kTp, MeshAxis::kCp, MeshAxis::kPp, MeshAxis::kDp};
  return {MeshAxis::kTp, MeshAxis::kCp, MeshAxis::kDp, MeshAxis::kPp};
}

void check_degrees(const MeshDegrees& d, int world_size) {
  const std::string cp = d.cp == 1 ? "" : detail::concat(", cp = ", d.cp);
  PARALLAX_CHECK(d.tp >= 1 && d.pp >= 1 && d.dp >= 1 && d.cp >= 1, ConfigError,
                 "parallel degrees must be >= 1, got tp = ", d.tp, ", pp = ", d.pp, ", dp = ", d.dp, ", cp = ", d.cp);
  const long long product = static_cast<long long>(d.tp) * d.pp * d.dp * d.cp;
  PARALLAX_CHECK(product == world_size, ConfigError, "tp × pp × dp", d.cp == 1 ? "" : " × cp",
                 " must equal the world size: tp = ", d.tp, ", pp = ", d.pp, ", dp = ", d.dp, cp, " gives ", product,
                 " ranks but the world has ", world_size);
  PARALLAX_CHECK(d.ep >= 1 && (d.dp * d.cp) % d.ep == 0, ConfigError, "ep = ", d.ep,
                 " must divide dp × cp = ", d.dp * d.cp,
                 ": expert parallelism folds inside the data-parallel replicas");
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
    PARALLAX_CHECK(
        count >= degrees.tp, TopologyError, "cannot keep tensor-parallel groups within nodes: tp = ", degrees.tp,
        " needs ", degrees.tp, " ranks on one node, but node '", host, "' hosts ranks ", format_rank_set(ranks), " (",
        count, "). Lower parallel.tp to at most ", count, ", or start ", degrees.tp,
        " ranks on every node (mpirun --map-by ppr:", degrees.tp, ":node, srun --ntasks-per-node=", degrees.tp, ")");
    PARALLAX_CHECK(count % degrees.tp == 0, TopologyError,
                   "cannot keep tensor-parallel groups within nodes: tp = ", degrees.tp,
                   " must divide the ranks of every node, but node '", host, "' hosts ranks ", format_rank_set(ranks),
                   " (", count, ", not a multiple of ", degrees.tp, "). Start a multiple of ", degrees.tp,
                   " ranks on every node (mpirun --map-by ppr:N:node, srun --ntasks-per-node=N), or choose a tp "
                   "that divides ",
                   count);
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
  bool inside = true;
  for (MeshAxis axis : kMeshAxes) inside = inside && c.of(axis) >= 0 && c.of(axis) < degrees_.of(axis);
  PARALLAX_CHECK(inside, UsageError, "coordinate (tp = ", c.tp, ", pp = ", c.pp, ", dp = ", c.dp, ", cp = ", c.cp,
                 ") is outside the mesh tp = ", degrees_.tp, ", pp = ", degrees_.pp, ", dp = ", degrees_.dp,
                 ", cp = ", degrees_.cp);
  return rank_at_[linear_index(degrees_, order_, c)];
}

int MeshLayout::color(const MeshAxes& axes, int rank) const {
  const MeshCoord& c = coord(rank);
  int color = 0;
  for (MeshAxis axis : kMeshAxes) {
    if (!axes.contains(axis)) color = color * degrees_.of(axis) + c.of(axis);
  }
  return color;
}

int MeshLayout::index_in_group(const MeshAxes& axes, int rank) const {
  const MeshCoord& c = coord(rank);
  const auto order = inner_to_outer(order_);
  int index = 0;
  for (auto axis = order.rbegin(); axis != order.rend(); ++axis) {
    if (axes.contains(*axis)) index = index * degrees_.of(*axis) + c.of(*axis);
  }
  return index;
}

std::vector<int> MeshLayout::group(const MeshAxes& axes, int rank) const {
  MeshCoord c = coord(rank);
  const int size = degrees_.of(axes);
  std::vector<int> ranks;
  ranks.reserve(static_cast<std::size_t>(size));
  for (int index = 0; index < size; ++index) {
    int rest = index;
    for (MeshAxis axis : inner_to_outer(order_)) {
      if (!axes.contains(axis)) continue;
      c.set(axis, rest % degrees_.of(axis));
      rest /= degrees_.of(axis);
    }
    ranks.push_back(rank_at(c));
  }
  return ranks;
}

std::vector<std::vector<int>> MeshLayout::groups(const MeshAxes& axes) const {
  std::vector<std::vector<int>> result(static_cast<std::size_t>(world_size() / degrees_.of(axes)));
  for (int rank = 0; rank < world_size(); ++rank) {
    if (index_in_group(axes, rank) == 0) result[static_cast<std::size_t>(color(axes, rank))] = group(axes, rank);
  }
  return result;
}

std::string MeshLayout::group_name(const MeshAxes& axes, int rank) const {
  const MeshCoord& c = coord(rank);
  const bool only_cp = axes == MeshAxes(MeshAxis::kCp);
  std::ostringstream out;
  const char* separator = "";
  for (MeshAxis axis : kMeshAxes) {
    if (!axes.contains(axis) || (!shown(axis, degrees_) && !only_cp)) continue;
    out << separator << to_string(axis);
    separator = "+";
  }
  out << '[';
  separator = "";
  for (MeshAxis axis : kMeshAxes) {
    if (axes.contains(axis) || !shown(axis, degrees_)) continue;
    out << separator << to_string(axis) << '=' << c.of(axis);
    separator = ",";
  }
  out << ']';
  return out.str();
}

std::string MeshLayout::describe(const Cluster& cluster) const {
  PARALLAX_CHECK(cluster.world_size() == world_size(), UsageError, "describing a mesh of ", world_size(),
                 " ranks with a cluster of ", cluster.world_size());
  const bool with_cp = shown(MeshAxis::kCp, degrees_);
  std::size_t host_width = 4;
  for (const auto& node : cluster.nodes()) host_width = std::max(host_width, node.hostname.size());
  std::ostringstream out;
  out << "mesh: tp = " << degrees_.tp << ", pp = " << degrees_.pp << ", dp = " << degrees_.dp;
  if (with_cp) out << ", cp = " << degrees_.cp;
  out << " (order " << to_string(order_) << ") over " << world_size() << " ranks on " << cluster.num_nodes()
      << (cluster.num_nodes() == 1 ? " node" : " nodes") << "; TP groups "
      << (rank_arithmetic_ ? "by rank arithmetic" : "cut per node (ranks not node-contiguous)") << '\n';
  out << "  rank  " << std::left << std::setw(static_cast<int>(host_width)) << "host" << std::right
      << "  local  tp  pp  dp" << (with_cp ? "  cp" : "") << '\n';
  for (int rank = 0; rank < world_size(); ++rank) {
    const RankLocation& at = cluster.location(rank);
    const MeshCoord& c = coords_[rank];
    out << std::setw(6) << rank << "  " << std::left << std::setw(static_cast<int>(host_width))
        << cluster.nodes()[at.node].hostname << std::right << std::setw(7) << at.local << std::setw(4) << c.tp
        << std::setw(4) << c.pp << std::setw(4) << c.dp;
    if (with_cp) out << std::setw(4) << c.cp;
    out << '\n';
  }
  std::vector<MeshAxes> sets = {MeshAxis::kTp, MeshAxis::kPp, MeshAxis::kDp};
  if (with_cp) sets.insert(sets.end(), {MeshAxis::kCp, MeshAxes{MeshAxis::kDp, MeshAxis::kCp}});
  for (const MeshAxes& axes : sets) {
    out << "  " << to_string(axes) << " groups:";
    for (const auto& ranks : groups(axes)) out << ' ' << format_rank_set(ranks);
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

std::unique_ptr<Communicator> split_over(Communicator& world,
                                         const Cluster& cluster,
                                         const MeshLayout& layout,
                                         const MeshAxes& axes) {
  const int rank = world.rank();
  const std::string name = layout.group_name(axes, rank);
  auto comm = world.split(layout.color(axes, rank), layout.index_in_group(axes, rank), name);
  const int expected = layout.degrees().of(axes);
  PARALLAX_ASSERT(comm != nullptr && comm->size() == expected, "group ", name, " has ", comm ? comm->size() : 0,
                  " ranks, expected ", expected);
  comm->set_member_nodes(nodes_of(cluster, layout.group(axes, rank)));
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
  tp_ = split_over(world, cluster_, layout_, MeshAxis::kTp);
  dp_ = split_over(world, cluster_, layout_, MeshAxis::kDp);
  pp_ = split_over(world, cluster_, layout_, MeshAxis::kPp);
  cp_ = split_over(world, cluster_, layout_, MeshAxis::kCp);
  if (degrees.cp > 1) dp_cp_ = split_over(world, cluster_, layout_, {MeshAxis::kDp, MeshAxis::kCp});
  if (degrees.ep > 1) {
    Communicator& replica_group = replicas();
    const std::vector<int> members = layout_.group({MeshAxis::kDp, MeshAxis::kCp}, world.rank());
    const int i = replica_group.rank();
    const int ep = degrees.ep;
    const MeshCoord& c = coord();
    ep_ = replica_group.split(i / ep, i % ep, detail::concat("ep[tp=", c.tp, ",pp=", c.pp, ",block=", i / ep, "]"));
    edp_ = replica_group.split(i % ep, i / ep, detail::concat("edp[tp=", c.tp, ",pp=", c.pp, ",ep=", i % ep, "]"));
    std::vector<int> block, same_place;
    for (int j = 0; j < static_cast<int>(members.size()); ++j) {
      if (j / ep == i / ep) block.push_back(members[static_cast<std::size_t>(j)]);
      if (j % ep == i % ep) same_place.push_back(members[static_cast<std::size_t>(j)]);
    }
    ep_->set_member_nodes(nodes_of(cluster_, block));
    edp_->set_member_nodes(nodes_of(cluster_, same_place));
  }
}

Communicator& Mesh::expert() {
  PARALLAX_CHECK(ep_ != nullptr, UsageError, "the mesh has no expert-parallel group: parallel.ep = 1");
  return *ep_;
}

Communicator& Mesh::group(const MeshAxes& axes) {
  if (axes == MeshAxes(MeshAxis::kTp)) return *tp_;
  if (axes == MeshAxes(MeshAxis::kCp)) return *cp_;
  if (axes == MeshAxes(MeshAxis::kPp)) return *pp_;
  if (axes == MeshAxes(MeshAxis::kDp)) return *dp_;
  if (axes == MeshAxes{MeshAxis::kDp, MeshAxis::kCp}) return dp_cp_ ? *dp_cp_ : *dp_;
  PARALLAX_CHECK(false, UsageError, "the mesh holds no communicator over ", to_string(axes),
                 "; it holds tp, cp, pp, dp and dp+cp");
  return *tp_;
}

std::string Mesh::describe() const {
  const MeshCoord& c = coord();
  std::ostringstream out;
  out << "this rank: world " << world_->rank() << " at tp = " << c.tp << ", pp = " << c.pp << ", dp = " << c.dp;
  if (degrees().cp > 1) out << ", cp = " << c.cp;
  out << '\n' << layout_.describe(cluster_);
  return out.str();
}

}  // namespace parallax
