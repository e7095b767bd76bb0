// Where each parameter lives in a flat, padded buffer sharded over the data-parallel
// group, and how parameters are grouped into such buffers. Pure arithmetic: no
// tensors, no communication, so it is tested with simulated ranks.
//
// A flat buffer holds its parameters back to back (no alignment gaps), then pads the
// end so its length is a multiple of the group size N. Rank r owns the contiguous
// shard [r·S, (r+1)·S), S = padded / N. A parameter may straddle shards; a rank may
// own no element of a small parameter, or only padding.
//
//   ShardLayout layout({10, 3}, 4);          // 13 elements, padded to 16, S = 4
//   layout.shard_numel();                    // 4
//   layout.fragment(1, 2);                   // param 1 elements [0, 2) at shard offset 2
//   layout.fragment(1, 3);                   // param 1 elements [2, 3) at shard offset 0
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace parallax::zero {

/// The part of one parameter that one rank's shard holds.
struct Fragment {
  std::int64_t param_offset = 0;  ///< first element, within the parameter (elements)
  std::int64_t shard_offset = 0;  ///< where it sits within the shard (elements)
  std::int64_t numel = 0;         ///< elements, > 0
};

class ShardLayout {
 public:
  /// `numels`: elements of each parameter in buffer order, each > 0; `ranks` ≥ 1.
  /// Throws InternalError otherwise.
  ShardLayout(std::vector<std::int64_t> numels, int ranks);

  int ranks() const { return ranks_; }
  std::size_t param_count() const { return numels_.size(); }
  /// Payload elements: the sum of the parameters' sizes.
  std::int64_t numel() const { return total_; }
  /// Buffer length in elements: numel() rounded up to a multiple of ranks().
  std::int64_t padded_numel() const { return shard_numel_ * ranks_; }
  /// Elements of one rank's shard.
  std::int64_t shard_numel() const { return shard_numel_; }
  /// padded_numel() − numel(), in [0, ranks() − 1].
  std::int64_t padding() const { return padded_numel() - total_; }
  /// First element of parameter `i` in the buffer.
  std::int64_t offset(std::size_t i) const { return offsets_.at(i); }
  std::int64_t numel(std::size_t i) const { return numels_.at(i); }
  /// The part of parameter `i` in rank `rank`'s shard, or nothing.
  std::optional<Fragment> fragment(std::size_t i, int rank) const;

 private:
  std::vector<std::int64_t> numels_;
  std::vector<std::int64_t> offsets_;
  std::int64_t total_ = 0;
  std::int64_t shard_numel_ = 0;
  int ranks_ = 1;
};

/// Splits items (in order) into consecutive groups of at most `max_bytes` each; an
/// item larger than `max_bytes` forms a group of its own. `bytes` each > 0,
/// `max_bytes` > 0. Returns indices into `bytes`.
std::vector<std::vector<std::size_t>> group_by_bytes(const std::vector<std::int64_t>& bytes, std::int64_t max_bytes);

}  // namespace parallax::zero
