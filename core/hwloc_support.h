// hwloc helpers shared by the translation units of parallax_topology (topology.cpp,
// cpu_binding.cpp), the only target that sees hwloc. Internal: not installed.
#pragma once

#include <hwloc.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "parallax/core/error.h"

namespace parallax::detail {

// Owns an hwloc topology; `what` names the input in every error.
class HwlocTopology {
 public:
  explicit HwlocTopology(std::string what) : what_(std::move(what)) {
    PARALLAX_CHECK(hwloc_topology_init(&topo_) == 0, TopologyError, "hwloc_topology_init failed for ", what_, ": ",
                   std::strerror(errno));
    // Keep GPUs, NICs and their PCI path; drop bridges and devices nobody asks about.
    hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  ~HwlocTopology() { hwloc_topology_destroy(topo_); }

  void load() {
    PARALLAX_CHECK(hwloc_topology_load(topo_) == 0, TopologyError, "hwloc could not load the topology of ", what_, ": ",
                   std::strerror(errno));
  }
  hwloc_topology_t get() const { return topo_; }

 private:
  std::string what_;
  hwloc_topology_t topo_ = nullptr;
};

inline std::string cpuset_string(hwloc_const_cpuset_t set) {
  if (set == nullptr) return "";
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "";
  std::string result(text);
  std::free(text);
  return result;
}

}  // namespace parallax::detail
