// Topology decides placement, on emulated clusters ([topology] emulate_nodes): the real
// engine trains configs/3d.toml (tp 2 × pp 2, × dp 2 on 8 ranks) on 2 and 4 emulated
// nodes whose ranks the launcher dealt in blocks or round robin, and matches the
// single-process reference; every tensor-parallel group lies inside one node (from the
// mesh the plan placed, and its communicator carried the TP traffic); pipeline stages
// cross nodes first, or data-parallel replicas with [parallel] order = "tp-pp-dp"; each
// rank's device is the GPU on the NUMA node of its cores. A
// cluster that cannot keep tp inside a node is refused with the arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "gpt_training.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/topology.h"
#include "parallax/runtime/plan.h"
#include "pipeline_training.h"

namespace {

struct Shape {
  int nodes;
  std::string order;              ///< "block" | "round_robin"
  std::string axes = "tp-dp-pp";  ///< parallel.order
};
void PrintTo(const Shape& shape, std::ostream* out) {
  *out << shape.nodes << " nodes, " << shape.order << ", " << shape.axes;
}

std::vector<std::string> emulation(const Shape& shape, int world) {
  const int per_node = world / shape.nodes;
  return {"topology.emulate_nodes=" + std::to_string(shape.nodes),
          "topology.emulate_rank_order=\"" + shape.order + "\"",
          "topology.emulate_node=\"pack:1 numa:2 core:8 pu:1 gpu:" + std::to_string(per_node) + "\""};
}

class EmulatedPlacement : public ::testing::TestWithParam<Shape> {};

TEST_P(EmulatedPlacement, TensorParallelStaysInsideNodesAndTrainingMatches) {
  const Shape& shape = GetParam();
  const int world = parallax::create_mpi_world_communicator()->size();
  if (world % 4 != 0 || world / shape.nodes < 2) GTEST_SKIP() << "tp 2 needs 2 ranks per node";
  std::vector<std::string> overrides = emulation(shape, world);
  overrides.push_back("model.n_layer=4");
  overrides.push_back("parallel.order=\"" + shape.axes + "\"");
  const parallax::Config config = equivalence::make_config(4, overrides, "3d.toml");
  equivalence::PipelineRun run;
  equivalence::expect_pipeline_matches_reference(
      config, std::to_string(shape.nodes) + " nodes " + shape.order + " " + shape.axes, equivalence::kFp32LossTolerance,
      equivalence::kFp32ParameterTolerance, &run);
  EXPECT_TRUE(run.tp_group_in_one_node) << run.explain;
  EXPECT_GT(run.group_bytes[0], 0) << "the tensor-parallel group carried no traffic";
  // The outermost axis crosses nodes before the other does: on 2 nodes of 4 ranks
  // (tp 2 × 2 of the inner axis) the inner axis's groups stay inside a node.
  // (The pipeline always has 2 stages; dp = world / 4 replicas.)
  const bool pp_outer = shape.axes == "tp-dp-pp";
  if (pp_outer || world / 4 > 1) {
    EXPECT_EQ(pp_outer ? run.pp_group_nodes : run.dp_group_nodes, 2) << run.explain;
  }
  if (world / shape.nodes == 4) {
    EXPECT_EQ(pp_outer ? run.dp_group_nodes : run.pp_group_nodes, 1) << run.explain;
  }
  if (run.world_rank == 0) std::printf("%s", run.explain.c_str());
}

INSTANTIATE_TEST_SUITE_P(Clusters,
                         EmulatedPlacement,
                         ::testing::Values(Shape{2, "block"},
                                           Shape{2, "round_robin"},
                                           Shape{4, "block"},
                                           Shape{4, "round_robin"},
                                           Shape{2, "block", "tp-pp-dp"},
                                           Shape{2, "round_robin", "tp-pp-dp"}),
                         [](const auto& info) {
                           std::string axes = info.param.axes;
                           std::replace(axes.begin(), axes.end(), '-', '_');
                           return std::to_string(info.param.nodes) + "_nodes_" + info.param.order + "_" + axes;
                         });

// The plan, without MPI: each rank's device is a GPU on the NUMA node its cores start in,
// no two ranks of a node share one, and groups carry the mesh's names.
TEST(PlanPlacement, EachRankGetsTheGpuNearItsCores) {
  for (const parallax::LauncherOrder order : {parallax::LauncherOrder::kBlock, parallax::LauncherOrder::kRoundRobin}) {
    const parallax::Cluster cluster =
        parallax::Cluster::synthetic(2, 4, order, "pack:2 numa:2 core:8 pu:1");  // 4 GPUs per node, 2 per NUMA
    parallax::ConfigSources sources;
    sources.overrides = {"parallel.tp=2", "parallel.pp=2", "train.micro_batch_size=1",
                         "tensor_parallel.plan={\"*\"=\"column\"}"};
    parallax::Config config = parallax::load_config(sources);
    config.resolve(8);
    const parallax::proto::Plan plan = parallax::make_plan(config, cluster, true);
    ASSERT_EQ(plan.ranks_size(), 8);
    std::map<std::string, std::set<std::string>> devices_of_node;
    for (const auto& rank : plan.ranks()) {
      const auto& node = cluster.nodes()[static_cast<std::size_t>(rank.node())];
      bool near = false;
      for (const auto& gpu : node.gpus) near |= gpu.name == rank.device() && gpu.numa_node == rank.numa();
      EXPECT_TRUE(near) << "rank " << rank.rank() << " got " << rank.device() << " away from NUMA " << rank.numa();
      EXPECT_TRUE(devices_of_node[rank.host()].insert(rank.device()).second) << rank.device() << " given twice";
      EXPECT_EQ(rank.tp_group().rfind("tp[", 0), 0u);
    }
    EXPECT_NE(parallax::describe_plan(plan).find("rank  tp  pp  dp  node"), std::string::npos);
  }
}

// 4 ranks on 4 emulated nodes: a tensor-parallel pair cannot share a node. Every rank
// refuses, naming the node and its ranks, before any model is built.
TEST(EmulatedPlacementRefusal, TensorParallelAcrossNodesIsRefused) {
  const int world = parallax::create_mpi_world_communicator()->size();
  if (world != 4) GTEST_SKIP() << "4 ranks";
  std::vector<std::string> overrides = emulation({4, "block"}, world);
  overrides.back() = "topology.emulate_node=\"pack:1 numa:1 core:4 pu:1 gpu:1\"";
  overrides.push_back("model.n_layer=4");
  try {
    equivalence::train_pipeline(equivalence::make_config(4, overrides, "3d.toml"));
    ADD_FAILURE() << "tp 2 over nodes of one rank each was accepted";
  } catch (const parallax::TopologyError& e) {
    EXPECT_NE(std::string(e.what()).find("node0"), std::string::npos) << e.what();
  }
}

}  // namespace
