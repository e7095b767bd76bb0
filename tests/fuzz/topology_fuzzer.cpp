// libFuzzer harness: topologies are outside input. A synthetic description comes from
// the user (topology.emulate_node, the planner's --cluster), every rank parses the
// serialized NodeTopology of every other (Cluster::gather), and an hwloc XML file is
// the user's. The input's first byte chooses which parser gets the rest:
//   's'  NodeTopology::from_synthetic, the rest as the description
//   'x'  NodeTopology::from_xml, the rest written to a file (only when built with
//        PARALLAX_FUZZ_HWLOC_XML, scripts/fuzz.sh's harness topology_xml: that fuzzes
//        hwloc's own XML importer, and Debian's hwloc 2.9.0 crashes on crafted files that
//        lack an object's complete_cpuset or put a PCI device at the root, fixed upstream
//        in 2026 by open-mpi/hwloc#783, #800 and #816; otherwise 'x' inputs are skipped)
//   else NodeTopology::parse, the rest as a peer's bytes
// Each must return a node or throw TopologyError: never crash, hang (a description of a
// billion PUs is a hang), leak or throw anything else. A node then makes a three-rank
// Cluster over two hosts (from_rank_topologies) and describes it, and its serialize()
// must parse back to an equal node (what every rank compares). Built and run by
// scripts/fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "parallax/core/error.h"
#include "parallax/core/topology.h"

namespace {

const std::string& xml_path() {
  static const std::string path = [] {
    char pattern[] = "/tmp/parallax_topology_fuzz.XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (made == nullptr) std::abort();
    return std::string(made) + "/node.xml";
  }();
  return path;
}

parallax::NodeTopology load(char parser, const std::string& text) {
  if (parser == 'x') {
#ifndef PARALLAX_FUZZ_HWLOC_XML
    throw parallax::TopologyError("hwloc XML is fuzzed by the topology_xml harness");
#endif
    std::ofstream(xml_path(), std::ios::binary | std::ios::trunc) << text;
    return parallax::NodeTopology::from_xml(xml_path());
  }
  if (parser == 's') return parallax::NodeTopology::from_synthetic(text);
  return parallax::NodeTopology::parse(text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    parallax::NodeTopology node = load(static_cast<char>(data[0]), text);
    if (!(parallax::NodeTopology::parse(node.serialize()) == node)) std::abort();
    parallax::NodeTopology other = node;
    other.hostname += "-other";
    const auto cluster = parallax::Cluster::from_rank_topologies({node, other, node});
    return cluster.describe().empty() ? 1 : 0;
  } catch (const parallax::TopologyError&) {
    return 0;
  }
}
