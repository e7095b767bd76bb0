#include "parallax/planner/cluster_spec.h"

#include <cstdio>

#include "parallax/core/error.h"

namespace parallax::planner {
namespace {

struct NamedCluster {
  const char* name;
  int devices_per_node;
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
// 4.8 TB/s, the H100's compute and NVLink). Network: one adapter per GPU. DGX-2H
// (Megatron-LM's 2019 machine: sixteen V100 SXM3 32 GB at 130 TFLOP/s fp16, 900 GB/s,
// NVSwitch 300 GB/s both directions, eight 100 Gb/s InfiniBand adapters per node).
const NamedCluster kPresets[] = {
    {"dgx-2h", 16, 32e9, 130e12, 0.9e12, 150e9, 6.25e9, 16e9},
    {"dgx-a100-40gb", 8, 40e9, 312e12, 1.555e12, 300e9, 25e9, 25e9},
    {"dgx-a100-80gb", 8, 80e9, 312e12, 2.039e12, 300e9, 25e9, 25e9},
    {"dgx-h100", 8, 80e9, 989e12, 3.35e12, 450e9, 50e9, 50e9},
    {"hgx-h200", 8, 141e9, 989e12, 4.8e12, 450e9, 50e9, 50e9},
};

// One CPU node of this project's test machines, each MPI rank a "device": fp32 through
// OpenBLAS on one core (~50 GFLOP/s), a share of the host's memory and its bandwidth,
// ranks talking through shared memory (Open MPI's vader) and, across emulated nodes,
// the same. Rough by nature: parallel.mode = "auto" measures its own machine instead.
ClusterSpec cpu_node(int nodes) {
  ClusterSpec spec;
  spec.name = "cpu";
  spec.nodes = nodes;
  spec.devices_per_node = 4;
  spec.device_memory_bytes = 4e9;
  spec.peak_flops = 50e9;
  spec.achievable_fraction = 0.5;
  spec.memory_bandwidth = 5e9;
  spec.intra_bandwidth = 2e9;
  spec.intra_latency = 5e-6;
  spec.inter_bandwidth = 2e9;
  spec.inter_latency = 5e-6;
  spec.host_bandwidth = 5e9;
  spec.host_adam_elements_per_second = 2e8;
  spec.reserved_fraction = 0.0;
  spec.layer_overhead = 200e-6;  // LibTorch's dispatch of a block's dozen CPU kernels
  return spec;
}

}  // namespace

ClusterSpec ClusterSpec::preset(const std::string& name, int nodes) {
  PARALLAX_CHECK(nodes >= 1, UsageError, "a cluster needs at least one node, got ", nodes);
  if (name == "cpu") return cpu_node(nodes);
  for (const NamedCluster& preset : kPresets) {
    if (name != preset.name) continue;
    ClusterSpec spec;
    spec.name = name;
    spec.nodes = nodes;
    spec.devices_per_node = preset.devices_per_node;
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
  std::string names = "cpu";
  for (const NamedCluster& preset : kPresets) names += ", " + std::string(preset.name);
  return names;
}

std::string ClusterSpec::describe() const {
  char text[200];
  const bool tera = peak_flops >= 1e12;
  std::snprintf(text, sizeof(text), "%d x %s (%d devices of %.0f GB, %.0f %s)", nodes, name.c_str(), devices(),
                device_memory_bytes / 1e9, tera ? peak_flops / 1e12 : peak_flops / 1e9, tera ? "TFLOP/s" : "GFLOP/s");
  return text;
}

}  // namespace parallax::planner
