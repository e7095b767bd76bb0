// Unit tests of the pure mesh placement (MeshLayout) on synthetic clusters: every layout
// keeps TP groups inside nodes, places every rank once, and forms consistent DP and PP
// groups, whether the launcher put ranks on nodes contiguously or round-robin.
#include "parallax/core/mesh.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

template <typename ErrorType, typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const ErrorType& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// The invariants every layout must satisfy.
void expect_valid(const Cluster& cluster, const MeshLayout& layout) {
  const MeshDegrees& d = layout.degrees();
  ASSERT_EQ(layout.world_size(), cluster.world_size());
  // Every rank exactly once, at a coordinate inside the mesh.
  std::set<std::tuple<int, int, int, int>> seen;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    const MeshCoord& c = layout.coord(rank);
    for (MeshAxis axis : kMeshAxes) EXPECT_TRUE(c.of(axis) >= 0 && c.of(axis) < d.of(axis)) << to_string(axis);
    EXPECT_TRUE(seen.emplace(c.tp, c.pp, c.dp, c.cp).second) << "rank " << rank << " shares a coordinate";
    EXPECT_EQ(layout.rank_at(c), rank);
  }
  // Per axis, and over dp+cp: the groups partition the world, have the product of their
  // degrees as size, are ordered by index_in_group, and agree on every other coordinate.
  std::vector<MeshAxes> sets(kMeshAxes.begin(), kMeshAxes.end());
  sets.push_back({MeshAxis::kDp, MeshAxis::kCp});
  for (const MeshAxes& axes : sets) {
    const int size = d.of(axes);
    auto groups = layout.groups(axes);
    ASSERT_EQ(static_cast<int>(groups.size()), layout.world_size() / size) << to_string(axes);
    std::set<int> members;
    for (std::size_t color = 0; color < groups.size(); ++color) {
      const auto& group = groups[color];
      ASSERT_EQ(static_cast<int>(group.size()), size);
      const MeshCoord& first = layout.coord(group[0]);
      for (int i = 0; i < size; ++i) {
        const MeshCoord& c = layout.coord(group[i]);
        EXPECT_TRUE(members.insert(group[i]).second);
        EXPECT_EQ(layout.color(axes, group[i]), static_cast<int>(color));
        EXPECT_EQ(layout.index_in_group(axes, group[i]), i);
        EXPECT_EQ(layout.group(axes, group[i]), group);
        for (MeshAxis other : kMeshAxes) {
          if (!axes.contains(other))
            EXPECT_EQ(c.of(other), first.of(other)) << to_string(axes) << " " << to_string(other);
        }
        if (axes == MeshAxes(MeshAxis::kTp)) EXPECT_EQ(c.tp, i);
        // TP groups never leave a node.
        if (axes == MeshAxes(MeshAxis::kTp)) EXPECT_EQ(cluster.node_of(group[i]), cluster.node_of(group[0]));
      }
    }
    EXPECT_EQ(static_cast<int>(members.size()), layout.world_size());
  }
}

struct Case {
  int tp, pp, dp;
  LauncherOrder order;
  AxisOrder axes;
};

class MeshLayoutOnTwoNodes : public ::testing::TestWithParam<Case> {};

TEST_P(MeshLayoutOnTwoNodes, IsValid) {
  const Case& c = GetParam();
  Cluster cluster = Cluster::synthetic(2, 4, c.order);
  MeshLayout layout = MeshLayout::place(cluster, {c.tp, c.pp, c.dp}, c.axes);
  expect_valid(cluster, layout);
  if (c.order == LauncherOrder::kBlock) {
    // Node-contiguous ranks: plain rank arithmetic, r = tp + T·(dp + D·pp) or, data
    // parallelism outermost, tp + T·(pp + P·dp).
    EXPECT_TRUE(layout.rank_arithmetic());
    for (int rank = 0; rank < 8; ++rank) {
      const MeshCoord& co = layout.coord(rank);
      EXPECT_EQ(
          c.axes == AxisOrder::kTpDpPp ? co.tp + c.tp * (co.dp + c.dp * co.pp) : co.tp + c.tp * (co.pp + c.pp * co.dp),
          rank);
    }
  }
  // The outermost axis crosses nodes first: with 4 ranks per node and tp × inner ≤ 4,
  // every group of the inner axis lies inside one node.
  const MeshAxis inner = c.axes == AxisOrder::kTpDpPp ? MeshAxis::kDp : MeshAxis::kPp;
  const int inner_degree = c.axes == AxisOrder::kTpDpPp ? c.dp : c.pp;
  if (c.tp * inner_degree <= 4) {
    for (const auto& group : layout.groups(inner)) {
      for (int rank : group) EXPECT_EQ(cluster.node_of(rank), cluster.node_of(group[0])) << to_string(inner);
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const int degrees[][3] = {{1, 1, 8}, {2, 1, 4}, {4, 1, 2}, {1, 2, 4}, {2, 2, 2},
                            {4, 2, 1}, {1, 8, 1}, {2, 4, 1}, {1, 4, 2}, {4, 1, 2}};
  for (AxisOrder axes : {AxisOrder::kTpDpPp, AxisOrder::kTpPpDp}) {
    for (LauncherOrder order : {LauncherOrder::kBlock, LauncherOrder::kRoundRobin}) {
      for (const auto& d : degrees) cases.push_back({d[0], d[1], d[2], order, axes});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Degrees, MeshLayoutOnTwoNodes, ::testing::ValuesIn(all_cases()), [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return "tp" + std::to_string(c.tp) + "_pp" + std::to_string(c.pp) + "_dp" + std::to_string(c.dp) +
             (c.order == LauncherOrder::kBlock ? "_contiguous" : "_rr") +
             (c.axes == AxisOrder::kTpDpPp ? "_pp_outer" : "_dp_outer") + "_" + std::to_string(info.index);
    });

TEST(MeshLayout, RoundRobinCutsTpGroupsPerNode) {
  // node0 hosts {0,2,4,6}, node1 hosts {1,3,5,7} (mpirun --map-by node).
  Cluster cluster = Cluster::synthetic(2, 4, LauncherOrder::kRoundRobin);
  MeshLayout layout = MeshLayout::place(cluster, {2, 2, 2});
  EXPECT_FALSE(layout.rank_arithmetic());
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(layout.groups(MeshAxis::kTp), (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(layout.groups(MeshAxis::kDp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.groups(MeshAxis::kPp), (Groups{{0, 1}, {4, 5}, {2, 3}, {6, 7}}));
  EXPECT_EQ(layout.coord(5), (MeshCoord{0, 1, 1}));
  EXPECT_EQ(layout.group_name(MeshAxis::kTp, 5), "tp[pp=1,dp=1]");
  EXPECT_EQ(layout.group_name(MeshAxis::kDp, 5), "dp[tp=0,pp=1]");
  EXPECT_EQ(layout.group_name(MeshAxis::kPp, 5), "pp[tp=0,dp=1]");

  // tp = 4 on round-robin nodes: each node's four ranks form one TP group.
  MeshLayout wide = MeshLayout::place(cluster, {4, 1, 2});
  EXPECT_EQ(wide.groups(MeshAxis::kTp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(wide.groups(MeshAxis::kDp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

// [parallel] order = "tp-pp-dp": each replica's pipeline inside a node, data parallelism
// across nodes, for both launcher orders.
TEST(MeshLayout, DataParallelOutermostKeepsPipelinesInNodes) {
  using Groups = std::vector<std::vector<int>>;
  MeshLayout block = MeshLayout::place(Cluster::synthetic(2, 4), {2, 2, 2}, AxisOrder::kTpPpDp);
  EXPECT_EQ(block.groups(MeshAxis::kTp), (Groups{{0, 1}, {4, 5}, {2, 3}, {6, 7}}));
  EXPECT_EQ(block.groups(MeshAxis::kPp), (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(block.groups(MeshAxis::kDp), (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  // Round robin: node0 hosts {0,2,4,6}, node1 {1,3,5,7}.
  MeshLayout dealt =
      MeshLayout::place(Cluster::synthetic(2, 4, LauncherOrder::kRoundRobin), {2, 2, 2}, AxisOrder::kTpPpDp);
  EXPECT_EQ(dealt.groups(MeshAxis::kTp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(dealt.groups(MeshAxis::kPp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dealt.groups(MeshAxis::kDp), (Groups{{0, 1}, {4, 5}, {2, 3}, {6, 7}}));
  EXPECT_NE(block.describe(Cluster::synthetic(2, 4)).find("(order tp-pp-dp)"), std::string::npos);
}

TEST(MeshLayout, ContiguousUsesRankArithmetic) {
  Cluster cluster = Cluster::synthetic(2, 4);
  MeshLayout layout = MeshLayout::place(cluster, {2, 2, 2});
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(layout.groups(MeshAxis::kTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.groups(MeshAxis::kDp), (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(layout.groups(MeshAxis::kPp), (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
}

TEST(MeshLayout, UnevenNodesWorkWhenTpDividesEach) {
  // Node 'a' hosts six ranks, 'b' two: tp = 2 fits; rank arithmetic already works.
  NodeTopology a = NodeTopology::from_synthetic("pack:1 core:8 pu:1");
  a.hostname = "a";
  NodeTopology b = a;
  b.hostname = "b";
  Cluster cluster = Cluster::from_rank_topologies({a, a, a, a, a, a, b, b});
  MeshLayout layout = MeshLayout::place(cluster, {2, 1, 4});
  EXPECT_TRUE(layout.rank_arithmetic());
  expect_valid(cluster, layout);
  // Interleaved and uneven: {0,2,4,5,6,7} and {1,3}; still possible per node.
  Cluster mixed = Cluster::from_rank_topologies({a, b, a, b, a, a, a, a});
  MeshLayout cut = MeshLayout::place(mixed, {2, 2, 2});
  EXPECT_FALSE(cut.rank_arithmetic());
  expect_valid(mixed, cut);
}

TEST(MeshLayout, ImpossiblePlacementsExplainWhy) {
  NodeTopology base = NodeTopology::from_synthetic("pack:1 core:8 pu:1");
  NodeTopology a = base, b = base;
  a.hostname = "a";
  b.hostname = "b";
  // Node 'b' (listed first) hosts ranks {1,3,5}; node 'a' hosts {0,2,4,6,7}.
  Cluster cluster({b, a}, {{1, 0}, {0, 0}, {1, 1}, {0, 1}, {1, 2}, {0, 2}, {1, 3}, {1, 4}});
  std::string message = error_of<TopologyError>([&] { MeshLayout::place(cluster, {4, 1, 2}); });
  EXPECT_NE(message.find("tp = 4 needs 4 ranks on one node, but node 'b' hosts ranks {1,3,5} (3)"), std::string::npos)
      << message;

  // tp does not divide a node's ranks.
  message = error_of<TopologyError>([&] { MeshLayout::place(cluster, {2, 1, 4}); });
  EXPECT_NE(message.find("node 'b' hosts ranks {1,3,5} (3, not a multiple of 2)"), std::string::npos) << message;

  // tp larger than any node.
  message = error_of<TopologyError>([] { MeshLayout::place(Cluster::synthetic(2, 4), {8, 1, 1}); });
  EXPECT_NE(message.find("tp = 8 needs 8 ranks on one node, but node 'node0' hosts ranks "
                         "{0,1,2,3} (4)"),
            std::string::npos)
      << message;
}

TEST(MeshLayout, DegreesMustMultiplyToWorldSize) {
  Cluster cluster = Cluster::synthetic(2, 4);
  std::string message = error_of<ConfigError>([&] { MeshLayout::place(cluster, {3, 1, 3}); });
  for (const char* part : {"tp = 3", "pp = 1", "dp = 3", "gives 9 ranks", "world has 8"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << " missing in: " << message;
  }
  message = error_of<ConfigError>([&] { MeshLayout::place(cluster, {0, 1, 8}); });
  EXPECT_NE(message.find("tp = 0"), std::string::npos) << message;
  EXPECT_THROW(check_degrees({2, 2, 2}, 4), ConfigError);
  EXPECT_NO_THROW(check_degrees({2, 2, 1}, 4));
}

TEST(MeshLayout, AccessorsCheckRanges) {
  MeshLayout layout = MeshLayout::place(Cluster::synthetic(1, 4), {2, 1, 2});
  EXPECT_THROW(layout.coord(4), UsageError);
  EXPECT_THROW(layout.coord(-1), UsageError);
  EXPECT_THROW(layout.rank_at({2, 0, 0}), UsageError);
  EXPECT_EQ(layout.rank_at({1, 0, 1}), 3);
}

TEST(MeshLayout, DescribeIsATable) {
  Cluster cluster = Cluster::synthetic(2, 4, LauncherOrder::kRoundRobin);
  const std::string text = MeshLayout::place(cluster, {2, 2, 2}).describe(cluster);
  EXPECT_NE(text.find("mesh: tp = 2, pp = 2, dp = 2 (order tp-dp-pp) over 8 ranks on 2 nodes"), std::string::npos)
      << text;
  EXPECT_NE(text.find("cut per node"), std::string::npos) << text;
  EXPECT_NE(text.find("rank  host   local  tp  pp  dp"), std::string::npos) << text;
  EXPECT_NE(text.find("     5  node1      2   0   1   1"), std::string::npos) << text;
  EXPECT_NE(text.find("tp groups: {0,2} {4,6} {1,3} {5,7}"), std::string::npos) << text;
  EXPECT_NE(text.find("pp groups: {0,1} {4,5} {2,3} {6,7}"), std::string::npos) << text;
  EXPECT_NE(text.find("dp groups: {0,4} {1,5} {2,6} {3,7}"), std::string::npos) << text;
}

// Context parallelism sits inside the node after tp: r = tp + T·(cp + C·(dp + D·pp)).
TEST(MeshLayout, ContextParallelIsTheAxisAfterTp) {
  using Groups = std::vector<std::vector<int>>;
  const Cluster cluster = Cluster::synthetic(2, 4);
  MeshLayout layout = MeshLayout::place(cluster, {/*tp=*/2, /*pp=*/1, /*dp=*/2, /*cp=*/2});
  expect_valid(cluster, layout);
  EXPECT_EQ(layout.coord(6), (MeshCoord{0, 0, 1, 1}));
  EXPECT_EQ(layout.groups(MeshAxis::kCp), (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  for (const auto& group : layout.groups(MeshAxis::kCp)) {
    EXPECT_EQ(cluster.node_of(group[0]), cluster.node_of(group[1])) << "a cp group left its node";
  }
  EXPECT_EQ(layout.groups(MeshAxis::kDp), (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  // dp+cp: the ranks that hold the same parameters; index cp + C·dp.
  const MeshAxes dp_cp{MeshAxis::kDp, MeshAxis::kCp};
  EXPECT_EQ(layout.groups(dp_cp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(layout.index_in_group(dp_cp, 6), 3);
  EXPECT_EQ(layout.group_name(MeshAxis::kTp, 6), "tp[pp=0,dp=1,cp=1]");
  EXPECT_EQ(layout.group_name(MeshAxis::kCp, 6), "cp[tp=0,pp=0,dp=1]");
  EXPECT_EQ(layout.group_name(dp_cp, 6), "dp+cp[tp=0,pp=0]");
  // Without cp the names, colors and tables are those of the three-axis mesh; a cp
  // group is then each rank alone.
  MeshLayout plain = MeshLayout::place(cluster, {2, 2, 2});
  EXPECT_EQ(plain.group_name(MeshAxis::kCp, 6), "cp[tp=0,pp=1,dp=1]");
  EXPECT_EQ(plain.group_name({MeshAxis::kDp, MeshAxis::kCp}, 6), "dp[tp=0,pp=1]");
  EXPECT_EQ(plain.groups({MeshAxis::kDp, MeshAxis::kCp}), plain.groups(MeshAxis::kDp));
  EXPECT_EQ(plain.describe(cluster).find("cp"), std::string::npos);

  const std::string text = layout.describe(cluster);
  for (const char* part : {"mesh: tp = 2, pp = 1, dp = 2, cp = 2 (order tp-dp-pp)", "local  tp  pp  dp  cp",
                           "     6  node1      2   0   0   1   1", "cp groups: {0,2} {4,6} {1,3} {5,7}",
                           "dp+cp groups: {0,2,4,6} {1,3,5,7}"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " missing in:\n" << text;
  }
}

// Data parallelism outermost, and round-robin launchers, with cp.
TEST(MeshLayout, ContextParallelUnderEveryOrderAndLauncher) {
  for (AxisOrder order : {AxisOrder::kTpDpPp, AxisOrder::kTpPpDp}) {
    for (LauncherOrder launcher : {LauncherOrder::kBlock, LauncherOrder::kRoundRobin}) {
      for (MeshDegrees d : {MeshDegrees{1, 2, 1, 4}, MeshDegrees{2, 1, 1, 4}, MeshDegrees{1, 1, 2, 4},
                            MeshDegrees{2, 2, 1, 2}, MeshDegrees{1, 2, 2, 2}, MeshDegrees{1, 1, 1, 8}}) {
        SCOPED_TRACE(::testing::Message() << "tp " << d.tp << " pp " << d.pp << " dp " << d.dp << " cp " << d.cp
                                          << " order " << to_string(order));
        const Cluster cluster = Cluster::synthetic(2, 4, launcher);
        MeshLayout layout = MeshLayout::place(cluster, d, order);
        expect_valid(cluster, layout);
        if (launcher == LauncherOrder::kBlock && d.tp * d.cp <= 4) {
          for (const auto& group : layout.groups(MeshAxis::kCp)) {
            for (int rank : group) EXPECT_EQ(cluster.node_of(rank), cluster.node_of(group[0]));
          }
        }
      }
    }
  }
}

TEST(MeshLayout, ContextParallelDegreeIsChecked) {
  const Cluster cluster = Cluster::synthetic(2, 4);
  std::string message = error_of<ConfigError>([&] { MeshLayout::place(cluster, {2, 1, 2, 4}); });
  EXPECT_NE(message.find("tp × pp × dp × cp must equal the world size: tp = 2, pp = 1, dp = 2, cp = 4 gives 16"),
            std::string::npos)
      << message;
  message = error_of<ConfigError>([&] { MeshLayout::place(cluster, {2, 1, 4, 0}); });
  EXPECT_NE(message.find("cp = 0"), std::string::npos) << message;
}

}  // namespace
}  // namespace parallax
