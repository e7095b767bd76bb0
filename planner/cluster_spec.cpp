#include "parallax/planner/cluster_spec.h"

#include <cstdio>

#include "parallax/core/error.h"

namespace parallax::planner {
namespace {

struct NamedCluster {
  const char* name;
  double memory;
  double flops;
  double memory_bandwidth;
  double nvlink;   // per direction
  double network;  // per device, per direction
  double pcie;     // per direction
};

// Vendors' datasheets: NVIDIA A100 Tensor Core GPU datasheet (SXM4: 312 TFLOP/s dense
// bf16; 1,555 GB/s HBM2 for 40 GB, 2,039 GB/s HBM2e for 80 GB; NVLink 600 GB/s both
// directions), DGX A100 user guide (eight 200 Gb/s HDR InfiniBand adapters, PCIe Gen4);
// H100 SXM5 datasheet (989 TFLOP/s dense bf16, 3.35 TB/s, NVLink 900 GB/s), DGX H100
// (eight 400 Gb/s NDR adapters, PCIe Gen5); H200 SXM datasheet (141 GB HBM3e,
// 4.8 TB/s, the H100's compute and NVLink). Network: one adapter per GPU.
const NamedCluster kPresets[] = {
    {"dgx-a100-40gb", 40e9, 312e12, 1.555e12, 300e9, 25e9, 25e9},
    {"dgx-a100-80gb", 80e9, 312e12, 2.039e12, 300e9, 25e9, 25e9},
    {"dgx-h100", 80e9, 989e12, 3.35e12, 450e9, 50e9, 50e9},
    {"hgx-h200", 141e9, 989e12, 4.8e12, 450e9, 50e9, 50e9},
};

}  // namespace

ClusterSpec ClusterSpec::preset(const std::string& name, int nodes) {
  PARALLAX_CHECK(nodes >= 1, UsageError, "a cluster needs at least one node, got ", nodes);
  for (const NamedCluster& preset : kPresets) {
    if (name != preset.name) continue;
    ClusterSpec spec;
    spec.name = name;
    spec.nodes = nodes;
    spec.devices_per_node = 8;
    spec.device_memory_bytes = preset.memory;
    spec.peak_flops = preset.flops;
    spec.memory_bandwidth = preset.memory_bandwidth;
    spec.intra_bandwidth = preset.nvlink;
    spec.inter_bandwidth = preset.network;
    spec.host_bandwidth = preset.pcie;
    return spec;
  }
  throw UsageError("unknown cluster preset '" + name + "' (known: " + preset_names() + ")");
}

std::string ClusterSpec::preset_names() {
  std::string names;
  for (const NamedCluster& preset : kPresets) names += (names.empty() ? "" : ", ") + std::string(preset.name);
  return names;
}

std::string ClusterSpec::describe() const {
  char text[200];
  std::snprintf(text, sizeof(text), "%d x %s (%d devices of %.0f GB, %.0f TFLOP/s)", nodes, name.c_str(), devices(),
                device_memory_bytes / 1e9, peak_flops / 1e12);
  return text;
}

}  // namespace parallax::planner
