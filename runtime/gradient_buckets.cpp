#include "parallax/runtime/gradient_buckets.h"

#include <torch/utils.h>

#include <algorithm>
#include <limits>

#include "parallax/core/error.h"

namespace parallax {
GradientBuckets::GradientBuckets(std::vector<torch::Tensor> params,
                                 std::int64_t bucket_bytes,
                                 Communicator& comm,
                                 Tracer& tracer,
                                 bool overlap,
                                 std::optional<torch::ScalarType> accumulate_dtype,
                                 const zero::OtherReductionGroup& other)
    : params_(std::move(params)),
      bucket_of_param_(params_.size()),
      comm_of_param_(params_.size(), &comm),
      offset_of_param_(params_.size()),
      comm_(comm),
      tracer_(tracer),
      overlap_(overlap),
      reduces_(comm.size() > 1) {
  for (std::size_t i : other.members) {
    PARALLAX_CHECK(other.comm != nullptr && i < params_.size(), UsageError, "gradient buckets: other group member ", i,
                   " is out of range (", params_.size(), " parameters) or has no communicator");
    comm_of_param_[i] = other.comm;
  }
  PARALLAX_CHECK(bucket_bytes > 0, UsageError, "gradient bucket size must be > 0 bytes, got ", bucket_bytes);
  // One bucket is one collective, and MPI counts elements in an int.
  constexpr std::int64_t kMaxBucketElements = std::numeric_limits<int>::max();
  // (a) Reverse registration order; a new bucket when the dtype or the group changes or
  // it is full.
  std::vector<std::vector<std::size_t>> groups;
  std::int64_t group_bytes = 0;
  for (std::size_t i = params_.size(); i-- > 0;) {
    const torch::Tensor& p = params_[i];
    PARALLAX_CHECK(p.requires_grad() && p.layout() == torch::kStrided, UsageError, "parameter ", i,
                   " must be a dense tensor that requires grad");
    PARALLAX_CHECK(p.numel() <= kMaxBucketElements, UsageError, "parameter ", i, " has ", p.numel(),
                   " elements; one collective carries at most ", kMaxBucketElements);
    // Sizes as the bucket will hold them (in the accumulate dtype).
    const auto element = static_cast<std::int64_t>(c10::elementSize(accumulate_dtype.value_or(p.scalar_type())));
    const std::int64_t bytes = p.numel() * element;
    const std::int64_t cap = std::min(bucket_bytes, kMaxBucketElements * element);
    const bool dtype_change = !groups.empty() && params_[groups.back().front()].scalar_type() != p.scalar_type();
    const bool group_change = !groups.empty() && comm_of_param_[groups.back().front()] != comm_of_param_[i];
    if (groups.empty() || dtype_change || group_change || (group_bytes > 0 && group_bytes + bytes > cap)) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(i);
    group_bytes += bytes;
  }

  for (auto& members : groups) {
    const torch::Tensor& first = params_[members.front()];
    const torch::ScalarType reduce_dtype = accumulate_dtype.value_or(first.scalar_type());
    std::int64_t numel = 0;
    for (std::size_t i : members) numel += params_[i].numel();
    Bucket bucket;
    bucket.buffer = torch::zeros({numel}, first.options().dtype(reduce_dtype).requires_grad(false));
    if (reduce_dtype != first.scalar_type()) {
      bucket.staging = torch::zeros({numel}, first.options().requires_grad(false));
    }
    std::int64_t offset = 0;
    for (std::size_t i : members) {
      offset_of_param_[i] = offset;
      offset += params_[i].numel();
      bucket_of_param_[i] = buckets_.size();
    }
    bucket.params = members;
    bucket.comm = comm_of_param_[members.front()];
    gradient_bytes_ += payload_bytes(bucket.buffer);
    reduced_bytes_ += payload_bytes(bucket.buffer);
    buffer_bytes_ += payload_bytes(bucket.buffer) + (bucket.staging.defined() ? payload_bytes(bucket.staging) : 0);
    buckets_.push_back(std::move(bucket));
  }

  // (b) The ledger's hooks.
  zero::GradientKeeper keeper;
  keeper.before = [this](std::size_t i, bool own) { before_accumulation(i, own); };
  keeper.after = [this](std::size_t i, bool own) { after_accumulation(i, own); };
  keeper.discard = [this](std::size_t i) { discard(i); };
  ledger_ = std::make_unique<zero::GradientLedger>(params_, std::move(keeper));
  zero();
}

GradientBuckets::~GradientBuckets() {
  ledger_.reset();
  // Never leave a collective reading freed buffers: wait for launched work, but do not
  // throw from a destructor (a failed communicator has already reported its error).
  for (Bucket& bucket : buckets_) {
    if (!bucket.work) continue;
    try {
      bucket.work->wait();
    } catch (const std::exception&) {
    }
  }
}

torch::Tensor GradientBuckets::region(const torch::Tensor& flat, std::size_t i) const {
  const torch::Tensor& p = params_[i];
  return flat.narrow(0, offset_of_param_[i], p.numel()).view(p.sizes());
}

zero::GradientLedger::OwnBackward GradientBuckets::own_backward(bool reduce) {
  auto guard = ledger_->lock();
  ledger_->sync_all();
  if (reduce && reduces_ && !armed_) {
    armed_ = true;
    next_to_launch_ = 0;
    for (Bucket& bucket : buckets_) bucket.pending = bucket.params.size();
  }
  return ledger_->own_backward();
}

void GradientBuckets::absorb_live(std::size_t i) {
  const torch::Tensor live = ledger_->live(i);
  if (!live.defined()) return;
  PARALLAX_CHECK(live.scalar_type() != torch::kFloat16 || !ledger_->foreign(i), UsageError, "parameter ", i, " (shape ",
                 params_[i].sizes(),
                 ") trains in fp16 with loss scaling, and another backward left a gradient in its .grad whose scale "
                 "this engine cannot know; call zero_grad() before this engine's backward, or train in bf16");
  torch::NoGradGuard no_grad;
  region(buckets_[bucket_of_param_[i]].buffer, i).add_(live);
  ledger_->clear(i);
}

void GradientBuckets::before_accumulation(std::size_t i, bool own) {
  Bucket& bucket = buckets_[bucket_of_param_[i]];
  // Another model's backward, or a late one of ours: the gradient waits in .grad.
  if (!own || bucket.launched || !bucket.staging.defined()) return;
  absorb_live(i);
  ledger_->lend(i, region(bucket.staging, i));  // zeroed since the last fold
}

void GradientBuckets::after_accumulation(std::size_t i, bool own) {
  Bucket& bucket = buckets_[bucket_of_param_[i]];
  if (!own || bucket.launched) return;
  if (bucket.staging.defined()) {
    // Fold this backward's narrow gradient into the wide accumulator, then clear it.
    torch::NoGradGuard no_grad;
    torch::Tensor staged = region(bucket.staging, i);
    region(bucket.buffer, i).add_(staged);
    staged.zero_();
    ledger_->hold(i);
  } else if (!ledger_->showing(i)) {
    // After a micro-batch of several (commit()): .grad is a tensor of its own.
    torch::NoGradGuard no_grad;
    region(bucket.buffer, i).add_(params_[i].grad());
    ledger_->hold(i);
  }
  if (!armed_) return;  // an accumulation micro-step: no communication
  if (bucket.pending > 0) --bucket.pending;
  if (overlap_) launch_ready_buckets();
}

void GradientBuckets::discard(std::size_t i) {
  Bucket& bucket = buckets_[bucket_of_param_[i]];
  if (bucket.work) bucket.work->wait();  // the reduction reads the buffer
  torch::NoGradGuard no_grad;
  region(bucket.buffer, i).zero_();
  if (bucket.staging.defined()) region(bucket.staging, i).zero_();
}

void GradientBuckets::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    launch(buckets_[next_to_launch_]);
    ++next_to_launch_;
  }
}

void GradientBuckets::launch(Bucket& bucket) {
  // The buffer is the reduction's now: the views leave .grad.
  for (std::size_t i : bucket.params) ledger_->hold(i);
  bucket.launched = true;
  if (bucket.comm->size() == 1) return;  // experts no other rank holds: nothing to add
  tracer_.record("all_reduce launch", "comm", tracer_.now_us(), 0);
  bucket.work = bucket.comm->all_reduce(bucket.buffer);
}

void GradientBuckets::finish() {
  {
    auto guard = ledger_->lock();
    ledger_->sync_all();
    // Gradients still in .grad whose bucket has not launched: another model's backward
    // reached them (narrow parameters; a wide one's .grad is the bucket itself).
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!buckets_[bucket_of_param_[i]].launched) absorb_live(i);
    }
    if (reduces_) {
      // (c) Buckets that never became ready, or every bucket when no backward reduced.
      armed_ = true;
      while (next_to_launch_ < buckets_.size()) {
        launch(buckets_[next_to_launch_]);
        ++next_to_launch_;
      }
    }
  }
  {
    auto span = tracer_.span("gradient all_reduce wait", "comm");
    for (Bucket& bucket : buckets_) {
      if (!bucket.work) continue;
      bucket.work->wait();
      bucket.work.reset();
    }
  }
  reduce_late_gradients();
  if (reduces_) {
    const double scale = 1.0 / static_cast<double>(comm_.size());
    for (Bucket& bucket : buckets_) bucket.buffer.mul_(scale);
  }
  ledger_->end_window();  // .grad shows the mean gradient, as after DDP's backward
}

// Gradients that reached .grad after their bucket's reduction began: one more all-reduce
// of all of them, added to the reduced buckets. Every rank runs the same backwards, so
// every rank holds the same late parameters.
void GradientBuckets::reduce_late_gradients() {
  auto guard = ledger_->lock();
  std::vector<std::size_t> late;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (ledger_->live(i).defined()) late.push_back(i);
  }
  if (late.empty()) return;
  std::vector<torch::Tensor> flat;
  for (std::size_t i : late) {
    PARALLAX_CHECK(params_[i].scalar_type() != torch::kFloat16 || !ledger_->foreign(i), UsageError, "parameter ", i,
                   " (shape ", params_[i].sizes(),
                   ") trains in fp16 with loss scaling, and another backward left a gradient in its .grad whose "
                   "scale this engine cannot know; call zero_grad() before this engine's backward, or train in bf16");
    flat.push_back(ledger_->live(i).reshape({-1}).to(buckets_[bucket_of_param_[i]].buffer.scalar_type()));
  }
  torch::Tensor sum = torch::cat(flat);
  if (reduces_) {
    ++late_reductions_;
    // One all-reduce per group the late parameters reduce over (the main one, the experts').
    std::vector<Communicator*> comms;
    for (std::size_t i : late) {
      if (std::find(comms.begin(), comms.end(), comm_of_param_[i]) == comms.end()) comms.push_back(comm_of_param_[i]);
    }
    for (Communicator* group : comms) {
      std::vector<torch::Tensor> parts;
      std::int64_t offset = 0;
      for (std::size_t i : late) {
        if (comm_of_param_[i] == group) parts.push_back(sum.narrow(0, offset, params_[i].numel()));
        offset += params_[i].numel();
      }
      if (group->size() > 1) sum_in_place(*group, parts);
    }
  }
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (std::size_t i : late) {
    const std::int64_t n = params_[i].numel();
    region(buckets_[bucket_of_param_[i]].buffer, i).add_(sum.narrow(0, offset, n).view(params_[i].sizes()));
    offset += n;
    ledger_->clear(i);
  }
}

void GradientBuckets::zero() {
  auto guard = ledger_->lock();
  for (Bucket& bucket : buckets_) {
    bucket.buffer.zero_();
    if (bucket.staging.defined()) bucket.staging.zero_();
    bucket.launched = false;
    bucket.work.reset();
  }
  armed_ = false;
  next_to_launch_ = 0;
  ledger_->end_window();
  // (a) Where the bucket has the parameters' dtype, .grad is its view.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Bucket& bucket = buckets_[bucket_of_param_[i]];
    if (!bucket.staging.defined()) ledger_->show(i, region(bucket.buffer, i));
  }
}

torch::Tensor GradientBuckets::accumulated_grad(std::size_t i) const {
  return region(buckets_[bucket_of_param_.at(i)].buffer, i);
}

}  // namespace parallax
