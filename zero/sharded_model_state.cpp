// ShardedModel's masters (gathered whole, read and overwritten by checkpoints) and its
// accounting: what the optimizer is and what this rank holds.
#include "parallax/zero/sharded_model_state.h"
#include "parallax/core/error.h"

namespace parallax::zero {

std::vector<torch::Tensor> ShardedModel::gather_masters() {
  State& s = *state_;
  std::vector<torch::Tensor> full_masters;
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const FlatGroup& group = *s.groups[g];
    const std::int64_t numel = group.layout().shard_numel();
    torch::Tensor full;
    torch::Tensor shard;
    if (s.offloaded) {
      full = torch::empty({group.layout().padded_numel()}, torch::kFloat32);
      shard = full.narrow(0, s.comm_of(g).rank() * numel, numel);  // gathered in place
      s.offloaded->read_master(g, shard);
    } else {
      shard = group.master().detach();
      full = torch::empty({group.layout().padded_numel()}, shard.options());
    }
    s.comm_of(g).all_gather(full, shard)->wait();
    full_masters.push_back(full);
  }
  std::vector<torch::Tensor> out;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const FlatGroup& group = *s.groups[s.group_of_param[i]];
    const std::size_t k = s.index_in_group[i];
    out.push_back(full_masters[s.group_of_param[i]]
                      .narrow(0, group.layout().offset(k), group.layout().numel(k))
                      .view(s.params[i].sizes()));
  }
  return out;
}

std::vector<MasterShard> ShardedModel::master_shards() const {
  const State& s = *state_;
  std::vector<MasterShard> shards(s.groups.size());
  if (!s.offloaded) {
    for (std::size_t g = 0; g < s.groups.size(); ++g) shards[g].master = s.groups[g]->master();
  }
  for (const State::Piece& piece : s.pieces) {
    if (piece.part.param != State::kPadding) shards[piece.group].parts.push_back(piece.part);
  }
  return shards;
}

void ShardedModel::masters_changed() {
  State& s = *state_;
  torch::NoGradGuard no_grad;
  if (s.schedule) {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.apply_locked(s.schedule->end_step());
  }
  s.publish_masters();
}

torch::optim::Optimizer& ShardedModel::optimizer() {
  PARALLAX_CHECK(state_->optimizer, UsageError, "the optimizer is offloaded: use offloaded_optimizer()");
  return *state_->optimizer;
}
const torch::optim::Optimizer& ShardedModel::optimizer() const {
  PARALLAX_CHECK(state_->optimizer, UsageError, "the optimizer is offloaded: use offloaded_optimizer()");
  return *state_->optimizer;
}
offload::OffloadedAdam* ShardedModel::offloaded_optimizer() {
  return state_->offloaded.get();
}
const offload::OffloadedAdam* ShardedModel::offloaded_optimizer() const {
  return state_->offloaded.get();
}
std::int64_t ShardedModel::host_bytes() const {
  return state_->offloaded ? state_->offloaded->host_bytes() : 0;
}
std::int64_t ShardedModel::nvme_bytes() const {
  return state_->offloaded ? state_->offloaded->nvme_bytes() : 0;
}

std::int64_t ShardedModel::parameter_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& group : state_->groups) bytes += group->parameter_bytes();
  return bytes;
}
std::int64_t ShardedModel::gradient_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& group : state_->groups) bytes += group->gradient_bytes();
  return bytes;
}
std::int64_t ShardedModel::master_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& group : state_->groups) bytes += group->master_bytes();
  return bytes;
}
std::int64_t ShardedModel::padding_elements() const {
  std::int64_t elements = 0;
  for (const auto& group : state_->groups) elements += group->layout().padding();
  return elements;
}
std::int64_t ShardedModel::other_group_padding_elements() const {
  const State& s = *state_;
  std::int64_t elements = 0;
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    if (&s.comm_of(g) != s.dp) elements += s.groups[g]->layout().padding();
  }
  return elements;
}
std::size_t ShardedModel::group_count() const {
  return state_->groups.size();
}
std::size_t ShardedModel::unit_count() const {
  return state_->unit_groups.size();
}
std::int64_t ShardedModel::peak_gathered_bytes() const {
  return state_->schedule ? state_->schedule->peak_live_bytes() : 0;
}
std::int64_t ShardedModel::order_changes() const {
  return state_->schedule ? state_->schedule->order_changes() : 0;
}
std::int64_t ShardedModel::prefetched_uses() const {
  return state_->prefetched_uses;
}
std::int64_t ShardedModel::gathers_on_use() const {
  return state_->gathers_on_use;
}
std::int64_t ShardedModel::largest_unit_bytes() const {
  std::int64_t largest = 0;
  for (std::size_t g : state_->unit_groups) largest = std::max(largest, state_->groups[g]->full_bytes());
  return largest;
}

}  // namespace parallax::zero
