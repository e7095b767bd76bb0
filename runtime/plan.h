// The Plan: everything the engines apply, decided in one place from the validated config
// and the gathered cluster (internal to runtime/; users see Runtime::explain()).
//
//   proto::Plan plan = parallax::make_plan(config, cluster);   // or ConfigError / TopologyError
//   std::cout << parallax::describe_plan(plan);
#pragma once

#include <string>

#include "parallax/core/config.h"
#include "parallax/core/topology.h"
#include "proto/plan.pb.h"

namespace parallax {

/// The plan for a resolved `config` on `cluster`: degrees, batch, ZeRO and offload,
/// precision, pipeline, the tensor-parallel rules, and every rank's placement (mesh
/// coordinates by MeshLayout::place, its node, its equal share of the node's cores,
/// the GPU nearest them, its groups). Pure, the same on every rank holding the same
/// inputs. Throws ConfigError listing every refusal of the strategy matrix
/// (strategy_matrix.h), TopologyError when tensor-parallel groups cannot stay inside
/// nodes (the message gives the arithmetic).
proto::Plan make_plan(const Config& config, const Cluster& cluster, bool emulated = false);

/// For people: the strategy in a few lines, then one row per rank (coordinates, node,
/// cores, device, groups), e.g.
///   rank  tp pp dp  node        local  cores  numa  device  tp group        pp group ...
std::string describe_plan(const proto::Plan& plan);

/// The trailing group columns of describe_plan's and --explain's rank tables: the
/// replicas' (dp) group alone, or with cp padded to 20 and the cp group after it.
std::string trailing_group_columns(bool cp, const std::string& replicas_group, const std::string& cp_group);

/// The synthetic node of world rank `rank` of `world_size` under [topology] emulation:
/// config.topology.emulate_node named "node<i>", i by emulate_rank_order. Throws
/// ConfigError when the world size is not a multiple of emulate_nodes, TopologyError
/// for a description hwloc rejects.
NodeTopology emulated_node(const TopologyOptions& topology, int rank, int world_size);

}  // namespace parallax
