// ZeRO-Offload's optimizer: one rank's fp32 master shards, their gradients and their
// Adam moments in host memory, updated by the fused CpuAdam; with the NVMe tier the
// moments (and, for parameter offload to NVMe, the masters) live in a SwapFile and
// are streamed through a few host buffers instead.
//
// Host layout: the shards are concatenated; one gradient buffer and (in memory) one
// master buffer and two moment buffers of T = Σ shard elements each. The caller's
// reduce-scatter writes into gradient(i); read_master(i, ...) is how the device side
// gets parameters back.
//
// NVMe tier: the file holds the moments (m, then v: T floats each) and optionally the
// masters (T floats more). A step walks tiles of E elements (E·streams·4 bytes =
// buffer_bytes) through `buffer_count` host buffers (no more than there are tiles):
// while tile k is updated, the I/O thread writes tile k−1 back and reads tiles up to
// k + buffer_count − 1 ahead, in FIFO order, so a buffer is refilled only after its
// previous tile was written.
//
//   OffloadedAdam adam(options, {shard0, shard1});   // copies the starting values
//   (reduce gradients into adam.gradient(i)) ... adam.set_learning_rate(lr); adam.step();
//   adam.read_master(0, device_shard);                // updated parameters, converted
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallax/offload/cpu_adam.h"

namespace parallax::offload {

class SwapFile;

struct OffloadedAdamOptions {
  /// The update rule (lr is reset by set_learning_rate).
  CpuAdamOptions adam{1e-3};
  /// Parameter groups of their own options: shard i steps with group shard_group[i]'s
  /// rule, group 0 being `adam` and group k >= 1 other_groups[k - 1]; each group's lr
  /// keeps its ratio to adam's through set_learning_rate. Default: every shard in group 0.
  std::vector<CpuAdamOptions> other_groups;
  std::vector<std::size_t> shard_group;
  /// Where each segment starts in the concatenated shards (ascending, the first 0): a
  /// segment (one parameter's part of a shard) keeps its own step count, and a step may
  /// skip it (no gradient), as LibTorch's Adam keeps a count per parameter and skips an
  /// undefined gradient. Default: one segment.
  std::vector<std::int64_t> segment_starts;
  /// The moments in the NVMe tier's file instead of host memory.
  bool moments_on_nvme = false;
  /// The masters there too (needs moments_on_nvme).
  bool masters_on_nvme = false;
  /// Directory of the file (offload.nvme_path).
  std::string nvme_path;
  /// Bytes of one host buffer of the tier (offload.buffer_mb), and how many (>= 2).
  std::int64_t buffer_bytes = 64 << 20;
  std::int64_t buffer_count = 4;
  /// Page-locked host tensors (CUDA LibTorch only; the caller decides).
  bool pin_memory = false;
  /// Who this is, for messages: "rank 3 on node7".
  std::string owner;
};

class OffloadedAdam {
 public:
  /// `initial_masters`: each shard's starting values (1-D, floating, any device),
  /// copied to host fp32. Throws ConfigError for a bad option or a directory that
  /// cannot take the file.
  OffloadedAdam(const OffloadedAdamOptions& options, const std::vector<torch::Tensor>& initial_masters);
  OffloadedAdam(const OffloadedAdam&) = delete;
  OffloadedAdam& operator=(const OffloadedAdam&) = delete;
  ~OffloadedAdam();

  std::size_t shard_count() const { return numels_.size(); }
  /// Shard i's gradient: host fp32, read by step(); the caller fills and zeroes it.
  const torch::Tensor& gradient(std::size_t i) const { return gradient_views_[i]; }
  /// Copies shard i's master into `destination` (same element count; converted to its
  /// dtype and device). Blocking; safe from several threads, not during step().
  void read_master(std::size_t i, const torch::Tensor& destination) const;

  /// Group 0's learning rate; every other group's is lr times its starting ratio.
  void set_learning_rate(double lr);
  double learning_rate() const { return updates_.front().options().lr_; }
  /// One Adam step of every shard from its gradient, but of the segments `skip` marks
  /// (per segment; empty: none), which keep their values, moments and step counts.
  /// Blocks. Throws OffloadError (NVMe), after every pending read and write has finished.
  void step(const std::vector<bool>& skip = {});
  /// Steps taken (Adam's t): the most of any segment's.
  std::int64_t step_count() const;
  /// A checkpoint's restored step count, for every segment.
  void set_step_count(std::int64_t steps);
  /// Segment k's own step count, and setting it (a checkpoint's).
  std::size_t segment_count() const { return segment_steps_.size(); }
  std::int64_t segment_steps(std::size_t k) const { return segment_steps_.at(k); }
  void set_segment_steps(std::size_t k, std::int64_t steps) { segment_steps_.at(k) = steps; }

  /// Shard i's state for a checkpoint, each 1-D over the shard, host fp32: "param" (the
  /// master), "exp_avg", "exp_avg_sq". In host memory they are views of the buffers, so
  /// a load writes through them; what lives in the NVMe tier comes as copies read from
  /// the file (the shard's state once in host memory), which write_state() puts back.
  /// Blocking; not during step().
  std::vector<std::pair<std::string, torch::Tensor>> state(std::size_t i) const;
  /// After a load filled state(i)'s tensors: writes what lives in the NVMe tier back to
  /// the file (nothing to do for views). Throws OffloadError.
  void write_state(std::size_t i, const std::vector<std::pair<std::string, torch::Tensor>>& state);

  /// Bytes held now in host memory (gradients, masters and moments, or the tier's
  /// buffers) and in the NVMe tier's file.
  std::int64_t host_bytes() const;
  std::int64_t nvme_bytes() const;
  /// The tier's traffic so far.
  std::int64_t nvme_bytes_read() const;
  std::int64_t nvme_bytes_written() const;
  /// Elements per tile of the NVMe tier (0 without it).
  std::int64_t tile_elements() const { return tile_elements_; }

 private:
  void step_in_memory();
  void step_through_tiles();
  /// Calls `run(group, at, n, steps)` for the elements [begin, begin + count) of the
  /// concatenated shards, cut where the group or the segment changes (`steps`: the
  /// segment's count), leaving out the segments skip_ marks.
  template <typename Run>
  void for_each_run(std::int64_t begin, std::int64_t count, const Run& run) const;

  OffloadedAdamOptions options_;
  std::vector<CpuAdam> updates_;         ///< per group
  std::vector<double> lr_ratios_;        ///< per group: its lr over group 0's, at the start
  std::vector<std::size_t> shard_group_;  ///< per shard
  std::vector<std::int64_t> segment_starts_;  ///< see OffloadedAdamOptions
  std::vector<std::int64_t> segment_steps_;   ///< per segment
  std::vector<bool> skip_;                    ///< per segment, this step
  std::vector<std::int64_t> numels_;
  std::vector<std::int64_t> offsets_;  ///< of each shard in the concatenated space
  std::int64_t total_ = 0;
  torch::Tensor gradients_;  ///< [T]
  std::vector<torch::Tensor> gradient_views_;
  torch::Tensor masters_;  ///< [T], unless on NVMe
  torch::Tensor moments_;  ///< [2, T], unless on NVMe
  // NVMe tier
  std::unique_ptr<SwapFile> file_;
  std::int64_t streams_ = 0;  ///< floats per element in the file: m, v (and master)
  std::int64_t tile_elements_ = 0;
  std::vector<torch::Tensor> buffers_;  ///< [streams, E] each
};

}  // namespace parallax::offload
