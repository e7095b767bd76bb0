#include "parallax/zero/flat_group.h"

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/variable.h>

#include "parallax/core/error.h"
#include "parallax/zero/deferred_construction.h"

namespace parallax::zero {
namespace {

std::vector<std::int64_t> numels_of(const std::vector<torch::Tensor>& params) {
  std::vector<std::int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  return numels;
}

}  // namespace

FlatGroup::FlatGroup(
    std::vector<torch::Tensor> params, int rank, int ranks, Residency residency, bool keep_full_gradients)
    : params_(std::move(params)),
      layout_(numels_of(params_), ranks),
      rank_(rank),
      residency_(residency),
      keep_full_gradients_(keep_full_gradients) {
  PARALLAX_ASSERT(!params_.empty(), "a flat group needs parameters");
  const torch::TensorOptions options = params_.front().options().requires_grad(false);
  torch::NoGradGuard no_grad;
  full_ = torch::zeros({layout_.padded_numel()}, options);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    PARALLAX_ASSERT(p.scalar_type() == options.dtype().toScalarType(), "a flat group holds one dtype");
    torch::Tensor place = full_.narrow(0, layout_.offset(i), p.numel()).view(p.sizes());
    materialize(p);  // a parameter built under DeferredConstruction gets its data only now
    place.copy_(p);
    p.set_data(place);
  }
  const std::int64_t shard = layout_.shard_numel();
  shard_ = full_.narrow(0, rank_ * shard, shard);
  if (residency_ == Residency::kSharded) {
    shard_ = shard_.clone();
    release();
  }
  master_ = shard_.scalar_type() == torch::kFloat32 ? shard_.detach() : shard_.to(torch::kFloat32);
  gradient_options_ = options.dtype(torch::kFloat32);
  if (keep_full_gradients_) {
    grad_full_ = torch::zeros({layout_.padded_numel()}, gradient_options_);
    grad_shard_ = grad_full_.narrow(0, rank_ * shard, shard);
  } else {
    grad_shard_ = torch::zeros({shard}, gradient_options_);
  }
  master_.mutable_grad() = grad_shard_;
}

FlatGroup::~FlatGroup() = default;

const c10::StorageImpl* FlatGroup::storage() const {
  return full_.storage().unsafeGetStorageImpl();
}

void FlatGroup::allocate_full() {
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  const std::size_t nbytes = static_cast<std::size_t>(full_bytes());
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
  full_live_ = true;
}

WorkPtr FlatGroup::gather(Communicator& comm) {
  PARALLAX_ASSERT(residency_ == Residency::kSharded && !full_live_, "gather of a group that is not released");
  allocate_full();
  pending_update_.order_current_stream();
  if (!fetch_) return comm.all_gather(full_, shard_);
  const std::int64_t shard = layout_.shard_numel();
  torch::Tensor own = full_.narrow(0, rank_ * shard, shard);
  {
    torch::NoGradGuard no_grad;
    fetch_(own);
  }
  return comm.all_gather(full_, own);  // in place: this rank's part is already there
}

void FlatGroup::use_host_gradient(torch::Tensor gradient, offload::SideStreamCopies& copies) {
  PARALLAX_ASSERT(
      gradient.numel() == layout_.shard_numel() && gradient.scalar_type() == torch::kFloat32 && gradient.is_cpu(),
      "a host gradient shard must hold the shard's elements in fp32 on the host");
  master_ = torch::Tensor();
  grad_shard_ = std::move(gradient);
  host_gradient_ = true;
  copies_ = &copies;
}

void FlatGroup::finish_host_gradient() {
  if (!host_gradient_) return;
  to_host_.wait();
  to_host_ = offload::HostCopy();
  if (staged_.defined()) {
    torch::NoGradGuard no_grad;
    grad_shard_.add_(staged_);
    staged_ = torch::Tensor();
  }
}

void FlatGroup::fetch_shard_from(std::function<void(const torch::Tensor& slot)> fetch) {
  PARALLAX_ASSERT(residency_ == Residency::kSharded && !full_live_ && host_gradient_,
                  "only a released sharded group of an offloaded optimizer fetches its shard");
  fetch_ = std::move(fetch);
  shard_ = torch::Tensor();
}

void FlatGroup::release() {
  PARALLAX_ASSERT(residency_ == Residency::kSharded, "only a sharded group releases its parameters");
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  full_live_ = false;
}

void FlatGroup::begin_micro_step() {
  reported_ = 0;
  if (!keep_full_gradients_ || !reduced_in_window_ || settled_.defined()) return;
  torch::NoGradGuard no_grad;
  // The full buffer still holds this rank's unreduced gradients beside its reduced
  // shard: set the shard aside (the host shard keeps it when offloaded), start again.
  if (!host_gradient_) settled_ = grad_shard_.clone();
  grad_full_.zero_();
}

bool FlatGroup::add_gradient(std::size_t i, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  if (!grad_full_.defined()) grad_full_ = torch::zeros({layout_.padded_numel()}, gradient_options_);
  grad_full_.narrow(0, layout_.offset(i), layout_.numel(i)).add_(grad.reshape({-1}));
  return ++reported_ == params_.size();
}

void FlatGroup::absorb_gradient(std::size_t i, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  if (!grad_full_.defined()) grad_full_ = torch::zeros({layout_.padded_numel()}, gradient_options_);
  grad_full_.narrow(0, layout_.offset(i), layout_.numel(i)).add_(grad.reshape({-1}).to(torch::kFloat32));
  absorbed_ = true;
}

void FlatGroup::discard_gradient(std::size_t i) {
  PARALLAX_ASSERT(!received_.defined() && !staged_.defined(), "a gradient discarded while its group is reduced");
  torch::NoGradGuard no_grad;
  if (grad_full_.defined()) grad_full_.narrow(0, layout_.offset(i), layout_.numel(i)).zero_();
  const auto fragment = layout_.fragment(i, rank_);
  if (!fragment) return;
  to_host_.wait();  // a reduced shard on its way to the host shard
  grad_shard_.narrow(0, fragment->shard_offset, fragment->numel).zero_();
  if (settled_.defined()) settled_.narrow(0, fragment->shard_offset, fragment->numel).zero_();
}

WorkPtr FlatGroup::reduce(Communicator& comm) {
  if (!grad_full_.defined()) grad_full_ = torch::zeros({layout_.padded_numel()}, gradient_options_);
  received_ = torch::empty({layout_.shard_numel()}, gradient_options_);
  return comm.reduce_scatter(received_, grad_full_);
}

void FlatGroup::complete_reduction() {
  torch::NoGradGuard no_grad;
  if (host_gradient_ && !received_.is_cpu()) {
    // From the device to the offloaded optimizer's host shard, on the side stream: the
    // copy (or, once the shard holds an earlier micro-step's gradient, a staging copy
    // added by finish_host_gradient) overlaps the rest of backward.
    if (!host_shard_written_) {
      to_host_ = copies_->copy(grad_shard_, received_);
    } else {
      PARALLAX_ASSERT(!staged_.defined(), "a group reduced twice before finish_host_gradient");
      staged_ = copies_->host_buffer(layout_.shard_numel(), torch::kFloat32);
      to_host_ = copies_->copy(staged_, received_);
    }
    host_shard_written_ = true;
    if (!keep_full_gradients_) grad_full_ = torch::Tensor();
  } else if (keep_full_gradients_) {
    // The window's first reduction replaces the shard (the rest of the full buffer is
    // zeroed with the step); a late one adds to the host shard, or to what was set aside.
    if (host_gradient_ && reduced_in_window_) {
      grad_shard_.add_(received_);
    } else {
      grad_shard_.copy_(received_);
    }
    if (settled_.defined()) grad_shard_.add_(settled_);
    settled_ = torch::Tensor();
  } else {
    grad_shard_.add_(received_);
    grad_full_ = torch::Tensor();
  }
  received_ = torch::Tensor();
  reported_ = 0;
  absorbed_ = false;
  reduced_in_window_ = true;
}

void FlatGroup::zero_gradients() {
  if (keep_full_gradients_) {
    grad_full_.zero_();
  } else {
    grad_shard_.zero_();
  }
  reported_ = 0;
  absorbed_ = false;
  reduced_in_window_ = false;
  settled_ = torch::Tensor();
  host_shard_written_ = false;
}

void FlatGroup::write_back_master() {
  PARALLAX_ASSERT(master_.defined(), "write_back_master with an offloaded optimizer");
  torch::NoGradGuard no_grad;
  if (master_.data_ptr() != shard_.data_ptr()) shard_.copy_(master_);
}

WorkPtr FlatGroup::gather_updated(Communicator& comm) {
  PARALLAX_ASSERT(residency_ == Residency::kReplicated, "only a replicated group gathers after an update");
  pending_update_.order_current_stream();
  return comm.all_gather(full_, shard_);
}

std::int64_t FlatGroup::parameter_bytes() const {
  const std::int64_t full = full_live_ ? full_bytes() : 0;
  if (residency_ == Residency::kReplicated || !shard_.defined()) return full;
  return full + payload_bytes(shard_);
}

std::int64_t FlatGroup::gradient_bytes() const {
  std::int64_t bytes = grad_full_.defined() ? payload_bytes(grad_full_) : 0;
  if (!keep_full_gradients_ && !host_gradient_) bytes += payload_bytes(grad_shard_);
  return bytes;
}

std::int64_t FlatGroup::master_bytes() const {
  if (!master_.defined() || master_.data_ptr() == shard_.data_ptr()) return 0;
  return payload_bytes(master_);
}

std::int64_t FlatGroup::full_bytes() const {
  return layout_.padded_numel() * static_cast<std::int64_t>(full_.element_size());
}

std::int64_t FlatGroup::full_gradient_bytes() const {
  return layout_.padded_numel() * static_cast<std::int64_t>(c10::elementSize(gradient_options_.dtype().toScalarType()));
}

}  // namespace parallax::zero
