#include "parallax/runtime/plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/cpu_binding.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/planner/strategy_matrix.h"
#include "parallax/runtime/plan_options.h"

namespace parallax {
namespace {

int numa_of(const NodeTopology& node, int core) {
  if (node.numa_nodes <= 1 || node.cores <= 0) return 0;
  return core * node.numa_nodes / node.cores;
}

// The GPU nearest a rank's cores: among the node's GPUs on the NUMA node its cores start
// in, the one matching its order among the ranks there; else (no GPU there) local mod GPUs.
std::string nearest_gpu(const Cluster& cluster, int rank) {
  const RankLocation& where = cluster.location(rank);
  const NodeTopology& node = cluster.nodes()[static_cast<std::size_t>(where.node)];
  if (node.gpus.empty()) return "";
  const auto& ranks = cluster.ranks_on(where.node);
  const int local_size = static_cast<int>(ranks.size());
  const int numa = numa_of(node, core_share(where.local, local_size, node.cores).first);
  int before = 0;  // ranks of this node with a lower local index whose cores start in the same NUMA node
  for (int other = 0; other < where.local; ++other) {
    if (numa_of(node, core_share(other, local_size, node.cores).first) == numa) ++before;
  }
  std::vector<const DeviceInfo*> near;
  for (const DeviceInfo& gpu : node.gpus) {
    if (gpu.numa_node == numa) near.push_back(&gpu);
  }
  if (!near.empty()) return near[static_cast<std::size_t>(before) % near.size()]->name;
  return node.gpus[static_cast<std::size_t>(where.local) % node.gpus.size()].name;
}

std::string format_range(const CoreShare& share) {
  if (share.count == 1) return std::to_string(share.first);
  return std::to_string(share.first) + "-" + std::to_string(share.first + share.count - 1);
}

}  // namespace

proto::Plan make_plan(const Config& config, const Cluster& cluster, bool emulated) {
  check_strategy(config);
  const ParallelOptions& p = config.parallel;
  const MeshLayout layout = MeshLayout::place(cluster, MeshDegrees{p.tp, p.pp, p.dp, p.cp, p.ep}, p.order);

  proto::Plan plan;
  record_strategy(config, plan);
  plan.set_nodes(cluster.num_nodes());
  plan.set_emulated(emulated);
  plan.set_placement(layout.rank_arithmetic() ? "tensor-parallel groups by rank arithmetic (node-contiguous ranks)"
                                              : "tensor-parallel groups cut from each node's own ranks");
  for (int rank = 0; rank < cluster.world_size(); ++rank) {
    const RankLocation& where = cluster.location(rank);
    const NodeTopology& node = cluster.nodes()[static_cast<std::size_t>(where.node)];
    // Its equal share of the node's cores, as rank_cpu_share binds them on a live node.
    const CoreShare share = core_share(where.local, static_cast<int>(cluster.ranks_on(where.node).size()), node.cores);
    const MeshCoord& coord = layout.coord(rank);
    proto::RankPlacement* placed = plan.add_ranks();
    placed->set_rank(rank);
    placed->set_tp(coord.tp);
    placed->set_pp(coord.pp);
    placed->set_dp(coord.dp);
    placed->set_node(where.node);
    placed->set_host(node.hostname);
    placed->set_local_rank(where.local);
    placed->set_cores(format_range(share));
    placed->set_numa(numa_of(node, share.first));
    placed->set_device(nearest_gpu(cluster, rank));
    placed->set_tp_group(layout.group_name(MeshAxis::kTp, rank));
    placed->set_pp_group(layout.group_name(MeshAxis::kPp, rank));
    placed->set_dp_group(layout.group_name(MeshAxis::kDp, rank));
    placed->set_cp(coord.cp);
    placed->set_cp_group(layout.group_name(MeshAxis::kCp, rank));
  }
  return plan;
}

std::string trailing_group_columns(bool cp, const std::string& replicas_group, const std::string& cp_group) {
  std::string text = replicas_group;
  if (cp) {
    text.resize(std::max<std::size_t>(text.size(), 20), ' ');
    text += " " + cp_group;
  }
  return text;
}

std::string describe_plan(const proto::Plan& plan) {
  std::ostringstream out;
  const proto::Degrees& d = plan.degrees();
  out << "plan: tp " << d.tp() << " x pp " << d.pp() << " x dp " << d.dp();
  if (d.cp() > 1) out << " x cp " << d.cp();
  if (d.ep() > 1) out << " (ep " << d.ep() << " inside dp x cp)";
  out << " (" << plan.axis_order() << ") on " << plan.ranks_size() << " ranks, " << plan.nodes()
      << (plan.emulated() ? " emulated" : "") << " node(s); " << plan.placement() << "\n";
  const Config strategy = recorded_strategy(plan);
  const TrainOptions& batch = strategy.train;
  out << "  zero.stage " << strategy.zero.stage << ", offload optimizer " << to_string(strategy.offload.optimizer)
      << " / param " << to_string(strategy.offload.param) << ", " << to_string(strategy.precision.dtype)
      << ", micro-batch " << batch.micro_batch_size << " x " << batch.grad_accum << " micro-steps x dp " << d.dp()
      << " = " << batch.global_batch_size << " samples\n";
  if (d.pp() > 1) {
    const PipelineOptions& pipeline = strategy.pipeline;
    std::string partition = to_string(pipeline.partition);
    if (pipeline.partition == PipelinePartition::kExplicit) {
      partition.clear();
      for (std::int64_t b : pipeline.boundaries) partition += (partition.empty() ? "[" : ", ") + std::to_string(b);
      partition += "]";
    }
    out << "  pipeline: " << to_string(pipeline.schedule) << ", " << pipeline.virtual_stages
        << " chunk(s) per stage, partition " << partition << ", recompute " << to_string(pipeline.recompute) << "\n";
  }
  if (d.cp() > 1) {
    const ContextParallelOptions& cp = strategy.context_parallel;
    out << "  context parallel: cp " << d.cp() << ", " << to_string(cp.method) << " attention, "
        << (cp.load_balance ? "load-balanced" : "contiguous") << " split of batch dimension " << cp.sequence_dim
        << "; gradients reduced over dp x cp = " << d.dp() * d.cp() << " ranks\n";
  }
  if (d.ep() > 1) {
    out << "  expert parallel: ep " << d.ep() << ", each MoE layer's experts shared out over blocks of " << d.ep()
        << " replicas; expert gradients reduced over dp x cp / ep = " << d.dp() * d.cp() / d.ep()
        << " ranks, dense ones over dp x cp = " << d.dp() * d.cp() << "\n";
  }
  if (d.tp() > 1 && !strategy.tensor_parallel.plan.empty()) {
    const TensorParallelOptions& tp = strategy.tensor_parallel;
    out << "  tensor parallel" << (tp.sequence_parallel ? " (sequence parallel)" : "") << ":";
    for (const TpPlanRule& rule : tp.plan) {
      out << " [" << rule.pattern << " = " << to_string(rule.style) << (rule.gather_output ? " (gathered)" : "") << "]";
    }
    out << "\n";
  }
  // With context parallelism, a cp coordinate after dp and the cp group last (the group
  // names are longer then: "tp[pp=0,dp=0,cp=0]").
  const bool cp = d.cp() > 1;
  const int width = cp ? 20 : 16;
  char line[320];
  std::snprintf(line, sizeof(line), "  %-5s %-3s %-3s %-3s %s%-16s %-5s %-7s %-4s %-7s %-*s %-*s %s\n", "rank", "tp",
                "pp", "dp", cp ? "cp  " : "", "node", "local", "cores", "numa", "device", width, "tp group", width,
                "pp group", trailing_group_columns(cp, "dp group", "cp group").c_str());
  out << line;
  for (const proto::RankPlacement& r : plan.ranks()) {
    char cp_coord[16] = "";
    if (cp) std::snprintf(cp_coord, sizeof(cp_coord), "%-3d ", r.cp());
    const std::string last = trailing_group_columns(cp, r.dp_group(), r.cp_group());
    std::snprintf(line, sizeof(line), "  %-5d %-3d %-3d %-3d %s%-16s %-5d %-7s %-4d %-7s %-*s %-*s %s\n", r.rank(),
                  r.tp(), r.pp(), r.dp(), cp_coord, r.host().c_str(), r.local_rank(), r.cores().c_str(), r.numa(),
                  r.device().empty() ? "-" : r.device().c_str(), width, r.tp_group().c_str(), width,
                  r.pp_group().c_str(), last.c_str());
    out << line;
  }
  return out.str();
}

NodeTopology emulated_node(const TopologyOptions& topology, int rank, int world_size) {
  const std::int64_t nodes = topology.emulate_nodes;
  PARALLAX_CHECK(nodes > 0 && world_size % nodes == 0, ConfigError, "topology.emulate_nodes = ", nodes, ": the ",
                 world_size, " ranks must be a multiple of the emulated nodes (each node hosts the same number)");
  const int index =
      dealt_location(rank, static_cast<int>(nodes), world_size / static_cast<int>(nodes), topology.emulate_rank_order)
          .node;
  NodeTopology node = NodeTopology::from_synthetic(topology.emulate_node);
  node.hostname = "node" + std::to_string(index);
  return node;
}

}  // namespace parallax
