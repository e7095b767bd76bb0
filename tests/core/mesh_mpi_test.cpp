// MPI-launched tests of the live cluster exchange and the Mesh: every rank gathers the
// cluster, builds meshes of several shapes, and checks its groups by reducing values
// chosen so the result names exactly the ranks that took part (rank r adds 2^r).
#include "parallax/core/mesh.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"

namespace parallax {
namespace {

std::unique_ptr<Communicator> world_communicator() {
  auto world = create_mpi_world_communicator();
  world->set_default_timeout(std::chrono::seconds(60));
  return world;
}

std::int64_t all_reduce_sum(Communicator& comm, std::int64_t value) {
  at::Tensor tensor = at::full({1}, value, at::kLong);
  comm.all_reduce(tensor)->wait();
  return tensor.item<std::int64_t>();
}

std::int64_t bits_of(const std::vector<int>& ranks) {
  std::int64_t mask = 0;
  for (int rank : ranks) mask |= std::int64_t{1} << rank;
  return mask;
}

TEST(ClusterMpi, GatherSeesEveryRank) {
  auto world = world_communicator();
  NodeTopology self = NodeTopology::discover();
  Cluster cluster = Cluster::gather(*world, self);
  ASSERT_EQ(cluster.world_size(), world->size());
  const NodeTopology& mine = cluster.nodes()[cluster.node_of(world->rank())];
  EXPECT_EQ(mine.hostname, self.hostname);
  EXPECT_EQ(mine.cores, self.cores);
  // Node-local indexes agree with what each rank knows: count of lower ranks on its host.
  const auto& on_node = cluster.ranks_on(cluster.node_of(world->rank()));
  EXPECT_EQ(on_node[cluster.location(world->rank()).local], world->rank());
  // The same cluster on every rank: compare a digest of the description.
  const std::int64_t digest = static_cast<std::int64_t>(std::hash<std::string>{}(cluster.describe()) & 0xffffffff);
  EXPECT_EQ(all_reduce_sum(*world, digest), digest * world->size());
  if (world->rank() == 0) std::cout << cluster.describe();
}

TEST(MeshMpi, GroupsReduceOverExactlyTheirRanks) {
  auto world = world_communicator();
  const int n = world->size();
  const int rank = world->rank();
  Cluster cluster = Cluster::gather(*world, NodeTopology::discover());

  std::vector<MeshDegrees> shapes = {{1, 1, n}};
  if (n % 2 == 0) {
    shapes.push_back({2, 1, n / 2});
    shapes.push_back({1, 2, n / 2});
  }
  if (n == 4) {
    shapes.push_back({2, 2, 1});
    shapes.push_back({1, 1, 2, 2});
    shapes.push_back({2, 1, 1, 2});
  }
  for (const MeshDegrees& d : shapes) {
    SCOPED_TRACE(::testing::Message() << "tp = " << d.tp << ", pp = " << d.pp << ", dp = " << d.dp
                                      << ", cp = " << d.cp);
    Mesh mesh(*world, cluster, d);
    const MeshLayout& layout = mesh.layout();
    const MeshCoord& c = mesh.coord();
    EXPECT_EQ(&mesh.world(), world.get());
    EXPECT_EQ(mesh.tp().size(), d.tp);
    EXPECT_EQ(mesh.pp().size(), d.pp);
    EXPECT_EQ(mesh.dp().size(), d.dp);
    EXPECT_EQ(mesh.tp().rank(), c.tp);
    EXPECT_EQ(mesh.pp().rank(), c.pp);
    EXPECT_EQ(mesh.dp().rank(), c.dp);
    EXPECT_EQ(mesh.tp().name(), layout.group_name(MeshAxis::kTp, rank));
    EXPECT_EQ(mesh.dp().name(), layout.group_name(MeshAxis::kDp, rank));
    EXPECT_EQ(mesh.pp().name(), layout.group_name(MeshAxis::kPp, rank));
    EXPECT_EQ(mesh.cp().size(), d.cp);
    EXPECT_EQ(mesh.cp().rank(), c.cp);
    const MeshAxes dp_cp{MeshAxis::kDp, MeshAxis::kCp};
    EXPECT_EQ(mesh.group(dp_cp).size(), d.dp * d.cp);
    EXPECT_EQ(mesh.group(dp_cp).rank(), layout.index_in_group(dp_cp, rank));
    EXPECT_EQ(mesh.group(dp_cp).name(), layout.group_name(dp_cp, rank));
    EXPECT_THROW(mesh.group({MeshAxis::kTp, MeshAxis::kPp}), UsageError);
    for (const MeshAxes& axis :
         {MeshAxes(MeshAxis::kTp), MeshAxes(MeshAxis::kPp), MeshAxes(MeshAxis::kDp), MeshAxes(MeshAxis::kCp), dp_cp}) {
      const std::vector<int> expected = layout.group(axis, rank);
      Communicator& group = mesh.group(axis);
      EXPECT_EQ(all_reduce_sum(group, std::int64_t{1} << rank), bits_of(expected))
          << to_string(axis) << " group " << group.name();
      // Each member's index in the group is its index_in_group (along one axis, its coordinate).
      EXPECT_EQ(all_reduce_sum(group, group.rank() == 0 ? rank : 0), expected[0]);
      // TP groups stay on one node.
      if (axis == MeshAxes(MeshAxis::kTp)) {
        for (int member : expected) EXPECT_EQ(cluster.node_of(member), cluster.node_of(rank));
      }
    }
    if (rank == 0) std::cout << mesh.describe();
  }
}

TEST(MeshMpi, RoundRobinClusterCutsTpGroupsPerNode) {
  auto world = world_communicator();
  const int n = world->size();
  const int rank = world->rank();
  // Pretend the launcher dealt the ranks over two nodes round-robin (--map-by node).
  Cluster cluster = Cluster::synthetic(2, n / 2, LauncherOrder::kRoundRobin);
  if (n < 4) {
    // One rank per node: no TP group of 2 fits in a node; every rank refuses alike.
    EXPECT_THROW((Mesh(*world, cluster, MeshDegrees{2, 1, n / 2})), TopologyError);
    return;
  }
  Mesh mesh(*world, cluster, {2, 1, n / 2});
  const MeshLayout& layout = mesh.layout();
  EXPECT_FALSE(layout.rank_arithmetic());
  for (MeshAxis axis : {MeshAxis::kTp, MeshAxis::kPp, MeshAxis::kDp}) {
    Communicator& group = mesh.group(axis);
    EXPECT_EQ(all_reduce_sum(group, std::int64_t{1} << rank), bits_of(layout.group(axis, rank))) << group.name();
  }
  for (int member : layout.group(MeshAxis::kTp, rank)) {
    EXPECT_EQ(member % 2, rank % 2) << "TP group left its (simulated) node";
  }
}

TEST(MeshMpi, BadDegreesThrowOnEveryRankBeforeCommunicating) {
  auto world = world_communicator();
  Cluster cluster = Cluster::gather(*world, NodeTopology::discover());
  EXPECT_THROW((Mesh(*world, cluster, MeshDegrees{world->size() + 1, 1, 1})), ConfigError);
  Cluster wrong_size = Cluster::synthetic(1, world->size() + 1);
  EXPECT_THROW((Mesh(*world, wrong_size, MeshDegrees{1, 1, world->size() + 1})), UsageError);
  // The world is still usable afterwards.
  EXPECT_EQ(all_reduce_sum(*world, 1), world->size());
}

}  // namespace
}  // namespace parallax
