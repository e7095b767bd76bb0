// Bucketed gradient reduction for data parallelism, overlapped with backward.
//
// Protocol (every rank of the data-parallel group runs the same steps):
//  a. At construction, parameters are grouped into buckets of at most `bucket_bytes`
//     (and at most INT_MAX elements: one collective) in reverse registration order
//     (roughly the order backward produces gradients), never mixing dtypes. Each bucket owns one flat tensor; every
//     parameter's .grad is a view into its bucket, so autograd accumulates straight into the buffer.
//  b. A post-hook on each parameter's gradient accumulator reports "gradient ready"
//     (first folding a narrower staging .grad into the wider bucket, see below).
//     Only on the last micro-step of an accumulation window (arm()), a bucket whose
//     parameters are all ready is all-reduced asynchronously — strictly in bucket
//     order, so every rank issues the same collectives in the same order even if
//     hooks fire in a different order.
//  c. finish() checks that every .grad is still its bucket view (a model.zero_grad()
//     that set grads to none would silently detach them), launches the buckets that
//     never became ready (parameters unused in this forward), waits for all, and
//     divides by the group size: .grad then holds the mean gradient over the group's
//     global batch.
//  d. zero() clears the buffers in place (never re-allocating, which would break the
//     views) before the next accumulation window.
//
//   GradientBuckets buckets(params, 25 << 20, dp_comm, tracer);
//   buckets.arm();  loss.backward();  buckets.finish();   // grads averaged
//   optimizer.step(); buckets.zero();
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/trace.h"

namespace parallax {
namespace zero {
class GradientHooks;
}

class GradientBuckets {
 public:
  /// `params` must be distinct dense leaf tensors that require grad; `bucket_bytes` > 0.
  /// With `overlap` false (`zero.overlap_comm = false`) nothing is launched during
  /// backward: finish() launches every bucket. With `accumulate_dtype` wider than a
  /// parameter's (fp32 for bf16 parameters), that parameter's .grad is a staging view
  /// of its own dtype, folded into the wider bucket after every backward and zeroed:
  /// micro-steps accumulate and the reduction runs in the wider dtype. The communicator
  /// and tracer must outlive this object. Does not communicate.
  GradientBuckets(std::vector<torch::Tensor> params,
                  std::int64_t bucket_bytes,
                  Communicator& comm,
                  Tracer& tracer,
                  bool overlap = true,
                  std::optional<torch::ScalarType> accumulate_dtype = std::nullopt);
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets();

  /// The next backward is the last of the accumulation window: reduce as gradients
  /// become ready.
  void arm();
  /// Completes the reduction started by arm() (see the protocol). Blocks; throws
  /// CommError on a failed or timed-out collective.
  void finish();
  /// UsageError unless every .grad is still its bucket view (finish() checks it first);
  /// for a caller that reduces nothing (a group of one).
  void check_gradient_views() const;
  /// Zeroes every bucket in place.
  void zero();

  std::size_t bucket_count() const { return buckets_.size(); }
  /// The accumulated (after finish(): reduced) gradient of parameter `i`, shaped like
  /// it, in the bucket's dtype: a view into the bucket, valid for this object's life.
  torch::Tensor accumulated_grad(std::size_t i) const;
  /// Bytes of gradient payload in the buckets' dtypes (sum of numel × element size).
  std::int64_t gradient_bytes() const { return gradient_bytes_; }
  /// Bytes of the reduced buffers beyond the gradients. Buckets are packed without
  /// alignment, so this is 0; it is kept so volume checks state the identity
  /// all-reduced bytes per window = gradient_bytes() + padding_bytes().
  std::int64_t padding_bytes() const { return reduced_bytes_ - gradient_bytes_; }
  /// Bytes held: the bucket buffers plus any narrower staging buffers.
  std::int64_t buffer_bytes() const { return buffer_bytes_; }

 private:
  struct Bucket {
    torch::Tensor buffer;             ///< reduced; the accumulate dtype
    torch::Tensor staging;            ///< the parameters' dtype when narrower; else undefined
    std::vector<std::size_t> params;  ///< indices into params_
    std::size_t pending = 0;          ///< gradients not yet ready in this window
    WorkPtr work;
  };

  void on_gradient_ready(std::size_t param_index);
  void launch_ready_buckets_locked();
  void launch_locked(Bucket& bucket);

  std::vector<torch::Tensor> params_;
  std::vector<std::size_t> bucket_of_param_;
  std::vector<std::int64_t> offset_of_param_;  ///< element offset within its bucket
  std::vector<const void*> grad_data_;         ///< where each .grad view must still point
  std::vector<Bucket> buckets_;
  std::unique_ptr<zero::GradientHooks> hooks_;
  Communicator& comm_;
  Tracer& tracer_;
  std::int64_t gradient_bytes_ = 0;
  std::int64_t reduced_bytes_ = 0;
  std::int64_t buffer_bytes_ = 0;

  bool overlap_ = true;
  std::mutex mutex_;  ///< hooks may run on autograd device threads
  bool armed_ = false;
  std::size_t next_to_launch_ = 0;
};

}  // namespace parallax
