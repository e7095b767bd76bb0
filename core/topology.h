// The hardware Parallax runs on: one node as hwloc sees it, and the cluster of nodes
// that the ranks of a job live on.
//
// A NodeTopology counts packages, NUMA nodes, cores and PUs and lists the GPUs and NICs
// (hwloc OS devices) with the NUMA node and cores they are near. It comes from the live
// machine, from an hwloc XML file (`lstopo node.xml`), or from an hwloc synthetic
// description, so that tests and the planner can reason about a DGX node on a laptop.
//
// A Cluster is the list of nodes plus, for every world rank, the node it runs on and its
// index among that node's ranks. It is built by exchanging every rank's NodeTopology
// over the world communicator (Cluster::gather), or synthetically (Cluster::synthetic),
// e.g. to simulate a launcher that deals ranks round-robin over the nodes.
//
//   auto self = parallax::NodeTopology::discover();             // this machine
//   auto cluster = parallax::Cluster::gather(world.communicator(), self);   // collective
//   std::cout << cluster.describe();
//
//   auto dgx = parallax::NodeTopology::from_synthetic("pack:2 numa:2 core:32 pu:2 gpu:8");
//   auto sim = parallax::Cluster::synthetic(2, 4, parallax::LauncherOrder::kRoundRobin);
//
// Everything here except Cluster::gather is pure and single-process.
#pragma once

#include <string>
#include <vector>

#include "parallax/core/config.h"

namespace parallax {

class Communicator;  // core/communicator.h; only Cluster::gather uses one

/// A GPU or a NIC (an hwloc OS device) and its locality.
struct DeviceInfo {
  /// hwloc OS device name, e.g. "cuda0", "nvml1", "rsmi0", "mlx5_0", "eth0"; for devices
  /// of a synthetic node "gpu0", "gpu1", ...
  std::string name;
  /// Which hwloc backend reported it, e.g. "CUDA", "NVML", "RSMI", "OpenCL",
  /// "OpenFabrics", "Network", "PCI" (a GPU seen only as a PCI device), "synthetic".
  std::string subtype;
  /// PCI address "domain:bus:device.function", e.g. "0000:3b:00.0"; "" when unknown.
  std::string pci_bus_id;
  /// OS index of the one NUMA node the device is near; -1 when it is equally near
  /// several (attached above them) or when hwloc cannot tell.
  int numa_node = -1;
  /// The PUs the device is near, hwloc list format (OS indexes), e.g. "0-15,32-47".
  std::string cpuset;
};

/// One node's hardware. Plain data: copyable, comparable field by field.
struct NodeTopology {
  /// The node's host name; ranks with the same host name share a node. Live: the
  /// gethostname() of this process; XML: the file's HostName (else its path);
  /// synthetic: "synthetic" (callers may overwrite it).
  std::string hostname;
  /// Where it came from: "live", "xml:<path>" or "synthetic:<description>".
  std::string source;
  int packages = 0;              ///< CPU packages (sockets), e.g. 2
  int numa_nodes = 0;            ///< NUMA nodes, e.g. 2
  int cores = 0;                 ///< physical cores over all packages, e.g. 64
  int pus = 0;                   ///< processing units (hardware threads), e.g. 128
  std::vector<DeviceInfo> gpus;  ///< accelerators, one entry per physical device
  std::vector<DeviceInfo> nics;  ///< network and OpenFabrics (InfiniBand, RoCE) devices

  /// Discovers this machine with hwloc, I/O devices included
  /// (HWLOC_TYPE_FILTER_KEEP_IMPORTANT). A GPU reported by several backends (cuda0 and
  /// nvml0 for one PCI device) is listed once. Throws TopologyError if hwloc fails.
  static NodeTopology discover();

  /// Loads an hwloc XML export (e.g. from `lstopo node.xml`). Throws TopologyError
  /// naming `path` when the file is missing or not a valid hwloc XML topology.
  static NodeTopology from_xml(const std::string& path);

  /// Builds a node from an hwloc synthetic description, e.g. "pack:2 numa:1 core:8 pu:2".
  /// Synthetic topologies have no I/O devices, so the description may also carry a
  /// token "gpu:N" (anywhere, e.g. "pack:2 numa:2 core:16 pu:2 gpu:8"): N GPUs named
  /// "gpu0".."gpuN-1", dealt over the NUMA nodes in order (GPU i near NUMA node
  /// i × numa_nodes / N, N at most 4096). Throws TopologyError naming `description`
  /// when hwloc rejects it, the gpu token is malformed, or its levels multiply to more
  /// than 16,384 PUs (no one node has that many; hwloc would take minutes to build it).
  static NodeTopology from_synthetic(const std::string& description);

  /// Protobuf wire form (proto/topology.proto), for exchanging between ranks.
  std::string serialize() const;
  /// Inverse of serialize(). Throws TopologyError when `bytes` does not parse.
  static NodeTopology parse(const std::string& bytes);

  /// One line, e.g. "node0: 2 packages, 2 NUMA, 32 cores, 64 PUs, 4 GPUs [cuda0@numa0 ...],
  /// 1 NIC [mlx5_0@numa0]".
  std::string describe() const;
};

bool operator==(const DeviceInfo& a, const DeviceInfo& b);
bool operator==(const NodeTopology& a, const NodeTopology& b);

/// Where a world rank lives.
struct RankLocation {
  int node = 0;   ///< index into Cluster::nodes()
  int local = 0;  ///< index among the ranks of that node, ordered by world rank
};

/// Where a launcher dealing ranks by `order` (config.h's LauncherOrder: kBlock, ranks
/// 0..k-1 on node 0 as mpirun --map-by slot; kRoundRobin, rank r on node r mod nodes as
/// --map-by node) puts world rank `rank` on `nodes` nodes of `per_node` ranks each. Pure.
RankLocation dealt_location(int rank, int nodes, int per_node, LauncherOrder order);

/// The nodes of a job and the node of every world rank. Immutable once built;
/// identical on every rank when built by gather().
class Cluster {
 public:
  /// Validates and takes `nodes` and `ranks` (one entry per world rank). Throws
  /// TopologyError when a rank names a node that does not exist, when the local
  /// indexes of a node are not 0..k-1 in world-rank order, or when a node hosts no rank.
  Cluster(std::vector<NodeTopology> nodes, std::vector<RankLocation> ranks);

  /// Groups per-rank topologies by host name: node i is the i-th distinct host name in
  /// rank order, described by the topology of its lowest rank; local indexes follow
  /// world rank. Pure; gather() uses it after the exchange.
  static Cluster from_rank_topologies(const std::vector<NodeTopology>& per_rank);

  /// Collective over `world` (every rank must call it; blocks until all have): each
  /// rank contributes `self`, every rank returns the same Cluster.
  /// Protocol: (a) serialize `self` (Protobuf); (b) all_gather the byte lengths as
  /// int64; (c) all_gather the bytes padded to the longest as uint8; (d) parse each
  /// slice and group by host name (from_rank_topologies).
  /// Throws CommError if the exchange fails or times out, TopologyError if a peer's
  /// bytes do not parse.
  static Cluster gather(Communicator& world, const NodeTopology& self);

  /// `nodes` identical nodes named "node0", "node1", ..., each with `gpus_per_node`
  /// GPUs and as many ranks (one per GPU), dealt by `order`. `node_description` is an
  /// hwloc synthetic description without a gpu token. Throws UsageError when
  /// nodes < 1 or gpus_per_node < 1, TopologyError for a bad description.
  static Cluster synthetic(int nodes,
                           int gpus_per_node,
                           LauncherOrder order = LauncherOrder::kBlock,
                           const std::string& node_description = "pack:2 numa:1 core:8 pu:2");

  const std::vector<NodeTopology>& nodes() const { return nodes_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  int world_size() const { return static_cast<int>(ranks_.size()); }
  /// Node and local index of world rank `rank`; throws UsageError when out of range.
  const RankLocation& location(int rank) const;
  int node_of(int rank) const { return location(rank).node; }
  /// World ranks on node `node`, in local-index order.
  const std::vector<int>& ranks_on(int node) const;
  /// True when every node's ranks are one consecutive range of world ranks, in node
  /// order (what rank arithmetic assumes).
  bool node_contiguous() const;

  /// Throws TopologyError naming the first node that differs from node 0 in cores, or
  /// (with `gpus`) in GPUs, the two counts, and the fix: every rank of a layout gets the
  /// same share of work, so a smaller node would set every step's pace, and a layout
  /// placed by GPUs would not fit it. Pure.
  void check_uniform(bool gpus) const;

  /// The cluster as the mesh sees it, one line per node:
  ///   "cluster: 2 nodes, 8 ranks\n"
  ///   "  node0: 2 packages, 2 NUMA, 16 cores, 32 PUs, 4 GPUs [...], 0 NICs; ranks {0,2,4,6}\n"
  std::string describe() const;

 private:
  std::vector<NodeTopology> nodes_;
  std::vector<RankLocation> ranks_;
  std::vector<std::vector<int>> node_ranks_;  // node -> world ranks by local index
};

/// "{0,2,4,6}", used in descriptions and error messages.
std::string format_rank_set(const std::vector<int>& ranks);

}  // namespace parallax
