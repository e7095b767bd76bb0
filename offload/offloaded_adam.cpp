#include "parallax/offload/offloaded_adam.h"

#include <algorithm>
#include <future>

#include "parallax/core/communicator.h"
#include "parallax/core/error.h"
#include "parallax/offload/swap_file.h"

namespace parallax::offload {
namespace {

// Waits for every operation; rethrows the first failure only after all are done, so
// no buffer is reused or freed while the I/O thread still touches it.
void wait_all(std::vector<std::future<void>>& pending) {
  std::exception_ptr failure;
  for (auto& operation : pending) {
    if (!operation.valid()) continue;
    try {
      operation.get();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  pending.clear();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

OffloadedAdam::OffloadedAdam(const OffloadedAdamOptions& options, const std::vector<torch::Tensor>& initial_masters)
    : options_(options) {
  updates_.emplace_back(options_.adam);
  lr_ratios_.push_back(1.0);
  for (const CpuAdamOptions& group : options_.other_groups) {
    updates_.emplace_back(group);
    lr_ratios_.push_back(group.lr_ / options_.adam.lr_);
  }
  shard_group_ = options_.shard_group;
  if (shard_group_.empty()) shard_group_.assign(initial_masters.size(), 0);
  PARALLAX_CHECK(shard_group_.size() == initial_masters.size(), UsageError, "OffloadedAdam: ", shard_group_.size(),
                 " shard groups for ", initial_masters.size(), " shards");
  for (std::size_t g : shard_group_) {
    PARALLAX_CHECK(g < updates_.size(), UsageError, "OffloadedAdam: shard group ", g, " of ", updates_.size());
  }
  PARALLAX_CHECK(!options_.masters_on_nvme || options_.moments_on_nvme, ConfigError,
                 "masters on NVMe need the moments there too (offload.optimizer = \"nvme\")");
  PARALLAX_CHECK(options_.buffer_count >= 2, ConfigError, "offload.buffer_count = ", options_.buffer_count,
                 ": expected an integer >= 2");
  PARALLAX_CHECK(!initial_masters.empty(), UsageError, "an offloaded optimizer needs at least one shard");
  for (const auto& master : initial_masters) {
    PARALLAX_CHECK(master.dim() == 1 && master.is_floating_point(), UsageError,
                   "a master shard must be a 1-D floating tensor, got ", master.sizes(), " ", master.scalar_type());
    offsets_.push_back(total_);
    numels_.push_back(master.numel());
    total_ += master.numel();
  }
  segment_starts_ = options_.segment_starts.empty() ? std::vector<std::int64_t>{0} : options_.segment_starts;
  PARALLAX_CHECK(segment_starts_.front() == 0 && std::is_sorted(segment_starts_.begin(), segment_starts_.end()) &&
                     segment_starts_.back() < total_,
                 UsageError, "OffloadedAdam: segment starts must ascend from 0 below ", total_);
  segment_steps_.assign(segment_starts_.size(), 0);
  skip_.assign(segment_starts_.size(), false);
  torch::NoGradGuard no_grad;
  const auto host = torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(options_.pin_memory);
  gradients_ = torch::zeros({total_}, host);
  for (std::size_t i = 0; i < numels_.size(); ++i)
    gradient_views_.push_back(gradients_.narrow(0, offsets_[i], numels_[i]));

  torch::Tensor masters = torch::empty({total_}, host);
  for (std::size_t i = 0; i < numels_.size(); ++i) masters.narrow(0, offsets_[i], numels_[i]).copy_(initial_masters[i]);
  if (!options_.moments_on_nvme) {
    masters_ = masters;
    moments_ = torch::zeros({2, total_}, host);
    return;
  }
  streams_ = options_.masters_on_nvme ? 3 : 2;
  tile_elements_ = std::max<std::int64_t>(1, options_.buffer_bytes / (4 * streams_));
  tile_elements_ = std::min(tile_elements_, total_);
  // The file reserves its whole size (zeros: the moments' starting values).
  file_ = std::make_unique<SwapFile>(options_.nvme_path, streams_ * total_ * 4, options_.owner);
  if (options_.masters_on_nvme) {
    file_->write(2 * total_ * 4, masters.data_ptr<float>(), total_ * 4);
  } else {
    masters_ = masters;
  }
  // Never more buffers than tiles: a state that fits one tile streams through one buffer.
  const std::int64_t buffers = std::min(options_.buffer_count, (total_ + tile_elements_ - 1) / tile_elements_);
  for (std::int64_t b = 0; b < buffers; ++b) buffers_.push_back(torch::empty({streams_, tile_elements_}, host));
}

OffloadedAdam::~OffloadedAdam() = default;

void OffloadedAdam::read_master(std::size_t i, const torch::Tensor& destination) const {
  PARALLAX_CHECK(i < numels_.size() && destination.numel() == numels_[i], UsageError, "read_master(", i, "): expected ",
                 i < numels_.size() ? numels_[i] : -1, " elements, got ", destination.numel());
  torch::NoGradGuard no_grad;
  if (masters_.defined()) {
    destination.view({-1}).copy_(masters_.narrow(0, offsets_[i], numels_[i]));
    return;
  }
  const bool direct =
      destination.is_cpu() && destination.scalar_type() == torch::kFloat32 && destination.is_contiguous();
  torch::Tensor staging = direct ? destination : torch::empty({numels_[i]}, torch::kFloat32);
  file_->read((2 * total_ + offsets_[i]) * 4, staging.data_ptr<float>(), numels_[i] * 4);
  if (!direct) destination.view({-1}).copy_(staging);
}

namespace {
// The state's names, in the order of the NVMe tier's streams: m, v, then the master.
constexpr const char* kStreamNames[] = {"exp_avg", "exp_avg_sq", "param"};
}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> OffloadedAdam::state(std::size_t i) const {
  PARALLAX_CHECK(i < numels_.size(), UsageError, "state(", i, "): ", numels_.size(), " shards");
  const std::int64_t at = offsets_[i], n = numels_[i];
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (std::int64_t s = 0; s < 3; ++s) {
    torch::Tensor values;
    if (s < 2 && moments_.defined()) {
      values = moments_[s].narrow(0, at, n);
    } else if (s == 2 && masters_.defined()) {
      values = masters_.narrow(0, at, n);
    } else {
      values = torch::empty({n}, torch::kFloat32);
      file_->read((s * total_ + at) * 4, values.data_ptr<float>(), n * 4);
    }
    out.emplace_back(kStreamNames[s], values);
  }
  // The master first, as the engines list a parameter's state.
  std::rotate(out.begin(), out.begin() + 2, out.end());
  return out;
}

void OffloadedAdam::write_state(std::size_t i, const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  PARALLAX_CHECK(i < numels_.size(), UsageError, "write_state(", i, "): ", numels_.size(), " shards");
  if (!file_) return;
  for (std::int64_t s = 0; s < streams_; ++s) {
    for (const auto& [name, values] : state) {
      if (name != kStreamNames[s]) continue;
      PARALLAX_CHECK(values.numel() == numels_[i] && values.is_cpu() && values.is_contiguous() &&
                         values.scalar_type() == torch::kFloat32,
                     UsageError, "write_state(", i, "): '", name, "' is not the shard's host fp32 state");
      file_->write((s * total_ + offsets_[i]) * 4, values.data_ptr<float>(), numels_[i] * 4);
    }
  }
}

void OffloadedAdam::step(const std::vector<bool>& skip) {
  PARALLAX_CHECK(skip.empty() || skip.size() == segment_steps_.size(), UsageError, "OffloadedAdam::step: ",
                 skip.size(), " skip flags for ", segment_steps_.size(), " segments");
  skip_ = skip.empty() ? std::vector<bool>(segment_steps_.size(), false) : skip;
  for (std::size_t k = 0; k < segment_steps_.size(); ++k) {
    if (!skip_[k]) ++segment_steps_[k];
  }
  if (file_) {
    step_through_tiles();
  } else {
    step_in_memory();
  }
}

std::int64_t OffloadedAdam::step_count() const {
  return *std::max_element(segment_steps_.begin(), segment_steps_.end());
}

void OffloadedAdam::set_step_count(std::int64_t steps) {
  std::fill(segment_steps_.begin(), segment_steps_.end(), steps);
}

void OffloadedAdam::set_learning_rate(double lr) {
  for (std::size_t g = 0; g < updates_.size(); ++g) updates_[g].options().lr(lr * lr_ratios_[g]);
}

template <typename Run>
void OffloadedAdam::for_each_run(std::int64_t begin, std::int64_t count, const Run& run) const {
  const std::int64_t end = begin + count;
  std::int64_t at = begin;
  // The first shard that ends after `begin`; runs extend over shards of one group.
  std::size_t i = static_cast<std::size_t>(
      std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin() - 1);
  std::size_t k = static_cast<std::size_t>(
      std::upper_bound(segment_starts_.begin(), segment_starts_.end(), begin) - segment_starts_.begin() - 1);
  while (at < end) {
    const std::size_t group = shard_group_[i];
    std::int64_t stop = std::min(end, offsets_[i] + numels_[i]);
    while (stop < end && shard_group_[i + 1] == group) stop = std::min(end, offsets_[++i] + numels_[i]);
    // Within the group's run, one call per segment.
    while (at < stop) {
      const std::int64_t segment_end = k + 1 < segment_starts_.size() ? segment_starts_[k + 1] : total_;
      const std::int64_t until = std::min(stop, segment_end);
      if (!skip_[k]) run(group, at, until - at, segment_steps_[k]);
      at = until;
      if (at == segment_end) ++k;
    }
    ++i;
  }
}

void OffloadedAdam::step_in_memory() {
  for_each_run(0, total_, [&](std::size_t group, std::int64_t at, std::int64_t n, std::int64_t steps) {
    updates_[group].step(masters_.data_ptr<float>() + at, gradients_.data_ptr<float>() + at,
                         moments_[0].data_ptr<float>() + at, moments_[1].data_ptr<float>() + at, n, steps);
  });
}

void OffloadedAdam::step_through_tiles() {
  const std::int64_t e = tile_elements_;
  const std::int64_t tiles = (total_ + e - 1) / e;
  const std::int64_t slots = static_cast<std::int64_t>(buffers_.size());
  std::vector<std::vector<std::future<void>>> pending(static_cast<std::size_t>(slots));
  auto elements_of = [&](std::int64_t k) { return std::min(e, total_ - k * e); };
  // Stream s of tile k sits at (s·T + k·E) floats in the file and at row s of its buffer.
  auto transfer = [&](std::int64_t k, bool write) {
    const std::size_t slot = static_cast<std::size_t>(k % slots);
    float* buffer = buffers_[slot].data_ptr<float>();
    for (std::int64_t s = 0; s < streams_; ++s) {
      const std::int64_t offset = (s * total_ + k * e) * 4;
      const std::int64_t bytes = elements_of(k) * 4;
      pending[slot].push_back(write ? file_->write_async(offset, buffer + s * e, bytes)
                                    : file_->read_async(offset, buffer + s * e, bytes));
    }
  };
  try {
    for (std::int64_t k = 0; k < std::min(tiles, slots - 1); ++k) transfer(k, false);
    for (std::int64_t k = 0; k < tiles; ++k) {
      // Queued behind tile k−1's write, which last used the buffer it reads into (with
      // one buffer: tile k itself, read after tile k−1 is written).
      if (k + slots - 1 < tiles) transfer(k + slots - 1, false);
      const std::size_t slot = static_cast<std::size_t>(k % slots);
      wait_all(pending[slot]);  // tile k is in (and the slot's previous tile is out)
      float* buffer = buffers_[slot].data_ptr<float>();
      float* master = options_.masters_on_nvme ? buffer + 2 * e : masters_.data_ptr<float>() + k * e;
      for_each_run(k * e, elements_of(k), [&](std::size_t group, std::int64_t at, std::int64_t n, std::int64_t steps) {
        const std::int64_t in_tile = at - k * e;
        updates_[group].step(master + in_tile, gradients_.data_ptr<float>() + at, buffer + in_tile,
                             buffer + e + in_tile, n, steps);
      });
      transfer(k, true);
    }
    for (auto& slot : pending) wait_all(slot);
  } catch (...) {
    for (auto& slot : pending) {
      try {
        wait_all(slot);
      } catch (...) {
      }
    }
    throw;
  }
}

std::int64_t OffloadedAdam::host_bytes() const {
  std::int64_t bytes = payload_bytes(gradients_);
  if (masters_.defined()) bytes += payload_bytes(masters_);
  if (moments_.defined()) bytes += payload_bytes(moments_);
  for (const auto& buffer : buffers_) bytes += payload_bytes(buffer);
  return bytes;
}

std::int64_t OffloadedAdam::nvme_bytes() const {
  return file_ ? file_->size() : 0;
}
std::int64_t OffloadedAdam::nvme_bytes_read() const {
  return file_ ? file_->bytes_read() : 0;
}
std::int64_t OffloadedAdam::nvme_bytes_written() const {
  return file_ ? file_->bytes_written() : 0;
}

}  // namespace parallax::offload
