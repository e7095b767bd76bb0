#include "parallax/runtime/gradient_buckets.h"

#include <torch/utils.h>

#include <algorithm>
#include <limits>

#include "parallax/core/error.h"
#include "parallax/zero/gradient_hooks.h"

namespace parallax {
GradientBuckets::GradientBuckets(std::vector<torch::Tensor> params,
                                 std::int64_t bucket_bytes,
                                 Communicator& comm,
                                 Tracer& tracer,
                                 bool overlap,
                                 std::optional<torch::ScalarType> accumulate_dtype)
    : params_(std::move(params)),
      bucket_of_param_(params_.size()),
      offset_of_param_(params_.size()),
      grad_data_(params_.size()),
      comm_(comm),
      tracer_(tracer),
      overlap_(overlap) {
  PARALLAX_CHECK(bucket_bytes > 0, UsageError, "gradient bucket size must be > 0 bytes, got ", bucket_bytes);
  // One bucket is one collective, and MPI counts elements in an int.
  constexpr std::int64_t kMaxBucketElements = std::numeric_limits<int>::max();
  // (a) Reverse registration order; a new bucket when the dtype changes or it is full.
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
    if (groups.empty() || dtype_change || (group_bytes > 0 && group_bytes + bytes > cap)) {
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
    const torch::Tensor& grads = bucket.staging.defined() ? bucket.staging : bucket.buffer;
    std::int64_t offset = 0;
    for (std::size_t i : members) {
      torch::Tensor& p = params_[i];
      // The view becomes .grad: autograd accumulates straight into the bucket (or its
      // staging buffer) in place.
      p.mutable_grad() = grads.narrow(0, offset, p.numel()).view(p.sizes());
      grad_data_[i] = p.grad().data_ptr();
      offset_of_param_[i] = offset;
      offset += p.numel();
      bucket_of_param_[i] = buckets_.size();
    }
    bucket.params = members;
    gradient_bytes_ += payload_bytes(bucket.buffer);
    reduced_bytes_ += payload_bytes(bucket.buffer);
    buffer_bytes_ += payload_bytes(bucket.buffer) + (bucket.staging.defined() ? payload_bytes(bucket.staging) : 0);
    buckets_.push_back(std::move(bucket));
  }

  // (b) One callback per gradient accumulator.
  hooks_ = std::make_unique<zero::GradientHooks>(params_, [this](std::size_t i) { on_gradient_ready(i); });
}

GradientBuckets::~GradientBuckets() {
  hooks_.reset();
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

void GradientBuckets::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  PARALLAX_ASSERT(!armed_, "arm() called twice without finish()");
  armed_ = true;
  next_to_launch_ = 0;
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.work.reset();
  }
}

void GradientBuckets::on_gradient_ready(std::size_t param_index) {
  Bucket& bucket = buckets_[bucket_of_param_[param_index]];
  if (bucket.staging.defined()) {
    // Fold this backward's narrow gradient into the wide accumulator, then clear it.
    torch::NoGradGuard no_grad;
    const torch::Tensor& grad = params_[param_index].grad();
    bucket.buffer.narrow(0, offset_of_param_[param_index], grad.numel()).add_(grad.reshape({-1}));
    grad.zero_();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;  // an accumulation micro-step: no communication
  if (bucket.pending > 0) --bucket.pending;
  if (overlap_) launch_ready_buckets_locked();
}

void GradientBuckets::launch_ready_buckets_locked() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    launch_locked(buckets_[next_to_launch_]);
    ++next_to_launch_;
  }
}

void GradientBuckets::launch_locked(Bucket& bucket) {
  tracer_.record("all_reduce launch", "comm", tracer_.now_us(), 0);
  bucket.work = comm_.all_reduce(bucket.buffer);
}

void GradientBuckets::finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    PARALLAX_ASSERT(armed_, "finish() without arm()");
    armed_ = false;  // first: a failed launch below must not leave the window open
    check_gradient_views();
    // (c) Parameters that took no part in this forward never fired their hook.
    while (next_to_launch_ < buckets_.size()) {
      launch_locked(buckets_[next_to_launch_]);
      ++next_to_launch_;
    }
  }
  auto span = tracer_.span("gradient all_reduce wait", "comm");
  const double scale = 1.0 / static_cast<double>(comm_.size());
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    bucket.work.reset();
    if (comm_.size() > 1) bucket.buffer.mul_(scale);
  }
}

void GradientBuckets::check_gradient_views() const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    PARALLAX_CHECK(params_[i].grad().defined() && params_[i].grad().data_ptr() == grad_data_[i], UsageError,
                   "the .grad of parameter ", i, " (shape ", params_[i].sizes(),
                   ") was replaced; gradients live in the engine's buckets: do not call zero_grad() on the "
                   "model or assign .grad (the engine zeroes gradients after each step)");
  }
}

void GradientBuckets::zero() {
  for (Bucket& bucket : buckets_) {
    bucket.buffer.zero_();
    if (bucket.staging.defined()) bucket.staging.zero_();
  }
}

torch::Tensor GradientBuckets::accumulated_grad(std::size_t i) const {
  const torch::Tensor& p = params_.at(i);
  return buckets_[bucket_of_param_[i]].buffer.narrow(0, offset_of_param_[i], p.numel()).view(p.sizes());
}

}  // namespace parallax
