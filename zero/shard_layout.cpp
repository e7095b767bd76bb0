#include "parallax/zero/shard_layout.h"

#include <algorithm>

#include "parallax/core/error.h"

namespace parallax::zero {

ShardLayout::ShardLayout(std::vector<std::int64_t> numels, int ranks) : numels_(std::move(numels)), ranks_(ranks) {
  PARALLAX_ASSERT(ranks_ >= 1, "a layout needs at least one rank, got ", ranks_);
  for (const std::int64_t n : numels_) {
    PARALLAX_ASSERT(n > 0, "a flat buffer holds non-empty parameters, got ", n, " elements");
    offsets_.push_back(total_);
    total_ += n;
  }
  shard_numel_ = (total_ + ranks_ - 1) / ranks_;
}

std::optional<Fragment> ShardLayout::fragment(std::size_t i, int rank) const {
  PARALLAX_ASSERT(rank >= 0 && rank < ranks_, "rank ", rank, " outside a layout of ", ranks_, " ranks");
  const std::int64_t begin = std::max(offsets_.at(i), rank * shard_numel_);
  const std::int64_t end = std::min(offsets_.at(i) + numels_.at(i), (rank + 1) * shard_numel_);
  if (begin >= end) return std::nullopt;
  return Fragment{begin - offsets_[i], begin - rank * shard_numel_, end - begin};
}

std::vector<std::vector<std::size_t>> group_by_bytes(const std::vector<std::int64_t>& bytes, std::int64_t max_bytes) {
  PARALLAX_ASSERT(max_bytes > 0, "group size must be positive, got ", max_bytes);
  std::vector<std::vector<std::size_t>> groups;
  std::int64_t filled = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    PARALLAX_ASSERT(bytes[i] > 0, "item ", i, " has ", bytes[i], " bytes");
    if (groups.empty() || filled + bytes[i] > max_bytes) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(i);
    filled += bytes[i];
  }
  return groups;
}

}  // namespace parallax::zero
