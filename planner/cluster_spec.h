// A cluster as the planner sees it: nodes of identical devices, each with its memory,
// peak throughput and memory bandwidth, and two classes of link (inside a node, across
// nodes), each an α–β model: a message of n bytes takes latency + n / bandwidth.
// Presets carry the vendors' published figures (cited in the .cpp).
#pragma once

#include <string>

namespace parallax::planner {

struct ClusterSpec {
  std::string name;
  int nodes = 1;
  int devices_per_node = 8;
  double device_memory_bytes = 80e9;
  /// Dense bf16 (or the device's training dtype) operations per second, per device.
  double peak_flops = 312e12;
  /// The share of peak a large matmul reaches (measured kernels reach 0.5–0.8 of the
  /// datasheet figure); the time model divides by peak_flops × this.
  double achievable_fraction = 0.6;
  double memory_bandwidth = 2.0e12;  ///< bytes/s of device memory (the optimizer step)
  /// One direction, per device, to another device of the node (NVLink) and of another
  /// node (the device's share of the node's network adapters).
  double intra_bandwidth = 300e9;
  double intra_latency = 5e-6;
  double inter_bandwidth = 25e9;
  double inter_latency = 10e-6;
  /// Host link per device (PCIe) and the host's Adam rate per device (elements/s):
  /// what offload costs.
  double host_bandwidth = 25e9;
  double host_adam_elements_per_second = 1e9;
  /// Fixed cost of one layer's forward per micro-batch beyond its operations (kernel
  /// launches, framework dispatch; the backward counts it twice): what makes many small
  /// micro-batches slower than a few large ones.
  double layer_overhead = 30e-6;
  /// Memory the runtime, the CUDA context and the allocator's fragmentation take from
  /// each device before any model state (a fraction of device_memory_bytes).
  double reserved_fraction = 0.1;

  int devices() const { return nodes * devices_per_node; }
  double usable_memory_bytes() const { return device_memory_bytes * (1.0 - reserved_fraction); }

  /// A preset ("cpu": a node of this project's CPU test machines, four ranks; "dgx-2h":
  /// sixteen V100s; "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200": eight GPUs) of `nodes`
  /// nodes; throws UsageError naming the known ones.
  static ClusterSpec preset(const std::string& name, int nodes);
  static std::string preset_names();

  /// "16 x dgx-h100 (128 devices of 80 GB, 989 TFLOP/s)"
  std::string describe() const;
};

}  // namespace parallax::planner
