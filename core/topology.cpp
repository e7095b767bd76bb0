#include "parallax/core/topology.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "parallax/core/error.h"
#include "parallax/core/hwloc_support.h"
#include "proto/topology.pb.h"
#include "synthetic_description.h"

namespace parallax {
namespace {

using detail::cpuset_string;
using detail::HwlocTopology;

std::string pci_bus_id(hwloc_obj_t obj) {
  for (; obj != nullptr; obj = obj->parent) {
    if (obj->type == HWLOC_OBJ_PCI_DEVICE) {
      char buffer[32];
      std::snprintf(buffer, sizeof(buffer), "%04x:%02x:%02x.%01x", static_cast<unsigned>(obj->attr->pcidev.domain),
                    static_cast<unsigned>(obj->attr->pcidev.bus), static_cast<unsigned>(obj->attr->pcidev.dev),
                    static_cast<unsigned>(obj->attr->pcidev.func));
      return buffer;
    }
  }
  return "";
}

// Fills numa_node and cpuset from the nearest non-I/O ancestor of `obj`. A device
// attached above several NUMA nodes (e.g. to the machine) is near none in particular.
void set_locality(hwloc_topology_t topo, hwloc_obj_t obj, DeviceInfo& device) {
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topo, obj);
  if (ancestor == nullptr || ancestor->cpuset == nullptr) return;
  device.cpuset = cpuset_string(ancestor->cpuset);
  int found = 0;
  for (hwloc_obj_t numa = nullptr; (numa = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, numa)) != nullptr;) {
    if (numa->cpuset != nullptr && hwloc_bitmap_intersects(numa->cpuset, ancestor->cpuset)) {
      device.numa_node = static_cast<int>(numa->os_index);
      ++found;
    }
  }
  if (found != 1) device.numa_node = -1;
}

// GPU backends by preference: when one PCI device is reported by several, the first wins.
constexpr const char* kGpuPrefixes[] = {"cuda", "rsmi", "ze", "nvml", "opencl"};
constexpr const char* kGpuSubtypes[] = {"CUDA", "RSMI", "LevelZero", "NVML", "OpenCL"};

// Index into kGpuPrefixes when `name` is "<prefix><digit>...", else -1.
int gpu_backend(const std::string& name) {
  for (int i = 0; i < static_cast<int>(std::size(kGpuPrefixes)); ++i) {
    std::size_t n = std::strlen(kGpuPrefixes[i]);
    if (name.size() > n && name.compare(0, n, kGpuPrefixes[i]) == 0 &&
        std::isdigit(static_cast<unsigned char>(name[n]))) {
      return i;
    }
  }
  return -1;
}

void collect_devices(hwloc_topology_t topo, NodeTopology& node) {
  std::vector<std::pair<int, DeviceInfo>> gpus;  // (backend preference, device)
  for (hwloc_obj_t obj = nullptr; (obj = hwloc_get_next_osdev(topo, obj)) != nullptr;) {
    std::string name = obj->name != nullptr ? obj->name : "";
    hwloc_obj_osdev_type_t type = obj->attr->osdev.type;
    DeviceInfo device;
    device.name = name;
    device.pci_bus_id = pci_bus_id(obj);
    if (type == HWLOC_OBJ_OSDEV_GPU || type == HWLOC_OBJ_OSDEV_COPROC) {
      int backend = gpu_backend(name);
      if (backend < 0) continue;  // displays, DRM nodes: not compute devices
      device.subtype = obj->subtype != nullptr ? obj->subtype : kGpuSubtypes[backend];
      set_locality(topo, obj, device);
      gpus.emplace_back(backend, std::move(device));
    } else if (type == HWLOC_OBJ_OSDEV_NETWORK || type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      device.subtype = type == HWLOC_OBJ_OSDEV_NETWORK ? "Network" : "OpenFabrics";
      set_locality(topo, obj, device);
      node.nics.push_back(std::move(device));
    }
  }
  // One entry per physical GPU: among devices sharing a PCI address keep the preferred
  // backend's; devices without an address are kept as they are.
  std::stable_sort(gpus.begin(), gpus.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> seen;
  for (auto& [backend, device] : gpus) {
    if (!device.pci_bus_id.empty()) {
      if (std::find(seen.begin(), seen.end(), device.pci_bus_id) != seen.end()) continue;
      seen.push_back(device.pci_bus_id);
    }
    node.gpus.push_back(std::move(device));
  }
  if (!node.gpus.empty()) return;
  // Without a GPU plugin (hwloc built without CUDA/NVML/RSMI) a GPU is still a PCI
  // display/3D controller from NVIDIA (0x10de) or AMD (0x1002).
  for (hwloc_obj_t obj = nullptr; (obj = hwloc_get_next_pcidev(topo, obj)) != nullptr;) {
    unsigned vendor = obj->attr->pcidev.vendor_id;
    unsigned klass = obj->attr->pcidev.class_id;
    if ((klass >> 8) != 0x03 || (vendor != 0x10de && vendor != 0x1002)) continue;
    DeviceInfo device;
    device.name = "gpu" + std::to_string(node.gpus.size());
    device.subtype = "PCI";
    device.pci_bus_id = pci_bus_id(obj);
    set_locality(topo, obj, device);
    node.gpus.push_back(std::move(device));
  }
}

void count_objects(hwloc_topology_t topo, NodeTopology& node) {
  node.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  node.numa_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  node.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  node.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
}

std::string local_hostname() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

void to_proto(const DeviceInfo& in, proto::Device* out) {
  out->set_name(in.name);
  out->set_subtype(in.subtype);
  out->set_pci_bus_id(in.pci_bus_id);
  out->set_numa_node(in.numa_node);
  out->set_cpuset(in.cpuset);
}

DeviceInfo from_proto(const proto::Device& in) {
  return DeviceInfo{in.name(), in.subtype(), in.pci_bus_id(), in.numa_node(), in.cpuset()};
}

std::string describe_devices(const std::vector<DeviceInfo>& devices, const char* one, const char* many) {
  std::ostringstream out;
  out << devices.size() << ' ' << (devices.size() == 1 ? one : many);
  if (devices.empty()) return out.str();
  out << " [";
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out << (i ? " " : "") << devices[i].name;
    if (devices[i].numa_node >= 0) out << "@numa" << devices[i].numa_node;
  }
  out << ']';
  return out.str();
}

}  // namespace

NodeTopology NodeTopology::discover() {
  HwlocTopology topo("this machine");
  topo.load();
  NodeTopology node;
  node.hostname = local_hostname();
  node.source = "live";
  count_objects(topo.get(), node);
  collect_devices(topo.get(), node);
  return node;
}

NodeTopology NodeTopology::from_xml(const std::string& path) {
  // hwloc's own message for a missing file is just errno; say which file first.
  PARALLAX_CHECK(std::ifstream(path).good(), TopologyError, "cannot read hwloc XML topology '", path,
                 "': ", std::strerror(errno));
  HwlocTopology topo("hwloc XML file '" + path + "'");
  PARALLAX_CHECK(hwloc_topology_set_xml(topo.get(), path.c_str()) == 0, TopologyError, "hwloc rejected XML topology '",
                 path, "': ", std::strerror(errno));
  topo.load();
  NodeTopology node;
  const char* host = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topo.get()), "HostName");
  node.hostname = host != nullptr ? host : path;
  node.source = "xml:" + path;
  count_objects(topo.get(), node);
  collect_devices(topo.get(), node);
  return node;
}

NodeTopology NodeTopology::from_synthetic(const std::string& description) {
  const auto [hwloc_part, gpus] = detail::check_synthetic_description(description);
  HwlocTopology topo("synthetic topology '" + description + "'");
  PARALLAX_CHECK(hwloc_topology_set_synthetic(topo.get(), hwloc_part.c_str()) == 0, TopologyError,
                 "bad synthetic topology '", description, "': hwloc rejected \"", hwloc_part,
                 "\" (expected levels from outermost to innermost, ending with pu, e.g. ",
                 "\"pack:2 numa:1 core:8 pu:2\"; HWLOC_SYNTHETIC_VERBOSE=1 prints hwloc's reason)");
  topo.load();
  NodeTopology node;
  node.hostname = "synthetic";
  node.source = "synthetic:" + description;
  count_objects(topo.get(), node);
  // GPU i sits near NUMA node i * numa_nodes / gpus, like a DGX's GPUs split per socket.
  for (int i = 0; i < gpus; ++i) {
    DeviceInfo device;
    device.name = "gpu" + std::to_string(i);
    device.subtype = "synthetic";
    hwloc_obj_t numa = hwloc_get_obj_by_type(topo.get(), HWLOC_OBJ_NUMANODE,
                                             static_cast<unsigned>(static_cast<long>(i) * node.numa_nodes / gpus));
    if (numa != nullptr) {
      device.numa_node = static_cast<int>(numa->os_index);
      device.cpuset = cpuset_string(numa->cpuset);
    }
    node.gpus.push_back(std::move(device));
  }
  return node;
}

std::string NodeTopology::serialize() const {
  proto::NodeTopology message;
  message.set_hostname(hostname);
  message.set_source(source);
  message.set_packages(packages);
  message.set_numa_nodes(numa_nodes);
  message.set_cores(cores);
  message.set_pus(pus);
  for (const auto& gpu : gpus) to_proto(gpu, message.add_gpus());
  for (const auto& nic : nics) to_proto(nic, message.add_nics());
  std::string bytes;
  PARALLAX_CHECK(message.SerializeToString(&bytes), TopologyError, "cannot serialize the topology of host '", hostname,
                 "'");
  return bytes;
}

NodeTopology NodeTopology::parse(const std::string& bytes) {
  proto::NodeTopology message;
  PARALLAX_CHECK(message.ParseFromString(bytes), TopologyError, "cannot parse a serialized ", "NodeTopology (",
                 bytes.size(), " bytes)");
  NodeTopology node;
  node.hostname = message.hostname();
  node.source = message.source();
  node.packages = message.packages();
  node.numa_nodes = message.numa_nodes();
  node.cores = message.cores();
  node.pus = message.pus();
  for (const auto& gpu : message.gpus()) node.gpus.push_back(from_proto(gpu));
  for (const auto& nic : message.nics()) node.nics.push_back(from_proto(nic));
  return node;
}

std::string NodeTopology::describe() const {
  std::ostringstream out;
  out << hostname << ": " << packages << (packages == 1 ? " package, " : " packages, ") << numa_nodes << " NUMA, "
      << cores << " cores, " << pus << " PUs, " << describe_devices(gpus, "GPU", "GPUs") << ", "
      << describe_devices(nics, "NIC", "NICs");
  return out.str();
}

bool operator==(const DeviceInfo& a, const DeviceInfo& b) {
  return a.name == b.name && a.subtype == b.subtype && a.pci_bus_id == b.pci_bus_id && a.numa_node == b.numa_node &&
         a.cpuset == b.cpuset;
}

bool operator==(const NodeTopology& a, const NodeTopology& b) {
  return a.hostname == b.hostname && a.source == b.source && a.packages == b.packages && a.numa_nodes == b.numa_nodes &&
         a.cores == b.cores && a.pus == b.pus && a.gpus == b.gpus && a.nics == b.nics;
}

// --- Cluster ---------------------------------------------------------------------------

Cluster::Cluster(std::vector<NodeTopology> nodes, std::vector<RankLocation> ranks)
    : nodes_(std::move(nodes)), ranks_(std::move(ranks)), node_ranks_(nodes_.size()) {
  PARALLAX_CHECK(!ranks_.empty(), TopologyError, "a cluster needs at least one rank");
  for (int rank = 0; rank < world_size(); ++rank) {
    const RankLocation& at = ranks_[rank];
    PARALLAX_CHECK(at.node >= 0 && at.node < num_nodes(), TopologyError, "rank ", rank, " is placed on node ", at.node,
                   " but the cluster has ", num_nodes(), " nodes");
    auto& on_node = node_ranks_[at.node];
    PARALLAX_CHECK(at.local == static_cast<int>(on_node.size()), TopologyError, "rank ", rank, " has local index ",
                   at.local, " on node '", nodes_[at.node].hostname,
                   "' but the node's local indexes must count 0, 1, ... in world-rank order"
                   " (expected ",
                   on_node.size(), ")");
    on_node.push_back(rank);
  }
  for (int node = 0; node < num_nodes(); ++node) {
    PARALLAX_CHECK(!node_ranks_[node].empty(), TopologyError, "node ", node, " ('", nodes_[node].hostname,
                   "') hosts no rank");
  }
}

Cluster Cluster::from_rank_topologies(const std::vector<NodeTopology>& per_rank) {
  std::vector<NodeTopology> nodes;
  std::vector<RankLocation> ranks;
  std::map<std::string, int> node_of_host;
  std::vector<int> next_local;
  for (const auto& topology : per_rank) {
    auto [it, inserted] = node_of_host.emplace(topology.hostname, static_cast<int>(nodes.size()));
    if (inserted) {
      nodes.push_back(topology);
      next_local.push_back(0);
    }
    ranks.push_back(RankLocation{it->second, next_local[it->second]++});
  }
  return Cluster(std::move(nodes), std::move(ranks));
}

void Cluster::check_uniform(bool gpus) const {
  const NodeTopology& first = nodes_.front();
  for (const NodeTopology& node : nodes_) {
    const bool cores_differ = node.cores != first.cores;
    const bool gpus_differ = gpus && node.gpus.size() != first.gpus.size();
    PARALLAX_CHECK(!cores_differ && !gpus_differ, TopologyError, "the nodes differ: node '", node.hostname, "' has ",
                   node.cores, " cores and ", node.gpus.size(), " GPU(s) but node '", first.hostname, "' (rank 0's) has ",
                   first.cores, " cores and ", first.gpus.size(),
                   " GPU(s). Every rank of a layout gets the same share of work, so the smaller node would set every "
                   "step's pace", gpus_differ ? " and the layout's GPUs would not fit it" : "",
                   ". Run on nodes of one kind (Slurm: one partition, or --constraint naming the node type)");
  }
}

RankLocation dealt_location(int rank, int nodes, int per_node, LauncherOrder order) {
  return order == LauncherOrder::kBlock ? RankLocation{rank / per_node, rank % per_node}
                                        : RankLocation{rank % nodes, rank / nodes};
}

Cluster Cluster::synthetic(int nodes, int gpus_per_node, LauncherOrder order, const std::string& node_description) {
  PARALLAX_CHECK(nodes >= 1 && gpus_per_node >= 1, UsageError,
                 "Cluster::synthetic needs nodes >= 1 and gpus_per_node >= 1, got nodes = ", nodes,
                 ", gpus_per_node = ", gpus_per_node);
  const NodeTopology node = NodeTopology::from_synthetic(node_description + " gpu:" + std::to_string(gpus_per_node));
  std::vector<NodeTopology> topologies(nodes, node);
  for (int i = 0; i < nodes; ++i) topologies[i].hostname = "node" + std::to_string(i);
  std::vector<RankLocation> ranks(static_cast<std::size_t>(nodes) * gpus_per_node);
  for (int rank = 0; rank < static_cast<int>(ranks.size()); ++rank) {
    ranks[rank] = dealt_location(rank, nodes, gpus_per_node, order);
  }
  return Cluster(std::move(topologies), std::move(ranks));
}

const RankLocation& Cluster::location(int rank) const {
  PARALLAX_CHECK(rank >= 0 && rank < world_size(), UsageError, "rank ", rank, " is outside the cluster's ",
                 world_size(), " ranks");
  return ranks_[rank];
}

const std::vector<int>& Cluster::ranks_on(int node) const {
  PARALLAX_CHECK(node >= 0 && node < num_nodes(), UsageError, "node ", node, " is outside the cluster's ", num_nodes(),
                 " nodes");
  return node_ranks_[node];
}

bool Cluster::node_contiguous() const {
  for (const auto& ranks : node_ranks_) {
    if (ranks.back() - ranks.front() + 1 != static_cast<int>(ranks.size())) return false;
  }
  return true;
}

std::string Cluster::describe() const {
  std::ostringstream out;
  out << "cluster: " << num_nodes() << (num_nodes() == 1 ? " node, " : " nodes, ") << world_size()
      << (world_size() == 1 ? " rank\n" : " ranks\n");
  for (int node = 0; node < num_nodes(); ++node) {
    out << "  " << nodes_[node].describe() << "; ranks " << format_rank_set(node_ranks_[node]) << '\n';
  }
  return out.str();
}

std::string format_rank_set(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << '{';
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  out << '}';
  return out.str();
}

}  // namespace parallax
