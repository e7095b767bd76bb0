// Bucketed gradient reduction for data parallelism, overlapped with backward.
//
// Protocol (every rank of the data-parallel group runs the same steps):
//  a. At construction, parameters are grouped into buckets of at most `bucket_bytes`
//     (and at most INT_MAX elements: one collective) in reverse registration order
//     (roughly the order backward produces gradients), never mixing dtypes. Each bucket
//     owns one flat tensor. Where it has the parameters' dtype, every parameter's .grad
//     is a view into it (zero/gradient_ledger.h's show()), so autograd accumulates
//     straight into the buffer and the trainer's zero_grad() zeroes it. Where it is wider
//     (fp32 for bf16 parameters), each owner's backward accumulates into a staging view
//     of the parameter's dtype, folded into the bucket and zeroed after every backward.
//  b. The gradient ledger's hooks report each parameter's gradient of the owner's
//     backward. Only in a window's reducing backward (arm()), a bucket whose parameters
//     are all ready is all-reduced asynchronously — strictly in bucket order, so every
//     rank issues the same collectives in the same order even if hooks fire in a
//     different order. A launched bucket holds its parameters' gradients (the ledger's
//     hold(): .grad shows a marker while the reduction reads the buffer).
//  c. Backwards after the reduction began (another loss of the same step, another
//     model's backward through these parameters) leave their gradients in .grad; so do
//     other models' backwards before it. finish() acts on what the trainer cleared in the
//     meantime, launches the buckets that never became ready (parameters unused in this
//     forward, or no reducing backward at all), waits, reduces the late gradients in one
//     more all-reduce, and divides by the group size: each bucket then holds the mean
//     gradient over the group's global batch.
//     Expert parallelism: the experts' parameters (`other`) reduce over their own group
//     (the ranks holding the same experts), in buckets of their own, and are divided by
//     the same main group size (every token of the global batch reached them through
//     the all-to-all: dividing by their own group's size would scale them by ep).
//  d. zero() clears the buffers in place (never re-allocating, which would break the
//     views) and shows the views again before the next accumulation window.
// A group of one rank reduces nothing; the rest is the same.
//
//   GradientBuckets buckets(params, 25 << 20, dp_comm, tracer);
//   { auto own = buckets.own_backward(/*reduce=*/true); loss.backward(); }
//   buckets.finish();   // averaged
//   optimizer.step(); buckets.zero();
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/trace.h"
#include "parallax/zero/gradient_ledger.h"
#include "parallax/zero/reduction_group.h"

namespace parallax {

class GradientBuckets {
 public:
  /// `params` must be distinct dense leaf tensors that require grad; `bucket_bytes` > 0.
  /// With `overlap` false (`zero.overlap_comm = false`) nothing is launched during
  /// backward: finish() launches every bucket. With `accumulate_dtype` wider than a
  /// parameter's (fp32 for bf16 parameters), the reduction runs in the wider dtype and
  /// micro-steps accumulate in it. `other`'s members reduce over its communicator
  /// instead of `comm` (see the protocol). The communicators and tracer must outlive this
  /// object. Does not communicate.
  GradientBuckets(std::vector<torch::Tensor> params,
                  std::int64_t bucket_bytes,
                  Communicator& comm,
                  Tracer& tracer,
                  bool overlap = true,
                  std::optional<torch::ScalarType> accumulate_dtype = std::nullopt,
                  const zero::OtherReductionGroup& other = {});
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets();

  /// Held around each of the owner's backwards. With `reduce` (the window's reducing
  /// backward) buckets launch as their gradients become ready; once they have, later
  /// backwards of the window are late (see the protocol, c).
  zero::GradientLedger::OwnBackward own_backward(bool reduce);
  /// A micro-batch of several ended: its gradients are the window's, beyond the
  /// trainer's zero_grad() (zero/gradient_ledger.h, f); later backwards' gradients are
  /// added into the buckets from fresh .grad tensors.
  void commit() { ledger_->commit(); }
  /// Completes the window (see the protocol). Blocks; throws CommError on a failed or
  /// timed-out collective.
  void finish();
  /// Zeroes every bucket in place; .grad shows the views again.
  void zero();
  /// The trainer's optimizer holds `sentinel`: its zero_grad() clears these gradients.
  void watch_zero_grad(torch::Tensor sentinel) { ledger_->watch_zero_grad(std::move(sentinel)); }
  /// Whether LibTorch's optimizer would step params[i] (zero/gradient_ledger.h, g): this
  /// rank's backwards gave it a gradient since the trainer last set gradients to none.
  bool has_gradient(std::size_t i) const { return ledger_->has_gradient(i); }

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
  /// All-reduces of late gradients since construction (protocol c), one per window
  /// that had any.
  std::int64_t late_reductions() const { return late_reductions_; }

 private:
  struct Bucket {
    torch::Tensor buffer;             ///< reduced; the accumulate dtype
    torch::Tensor staging;            ///< the parameters' dtype when narrower; else undefined
    std::vector<std::size_t> params;  ///< indices into params_
    Communicator* comm = nullptr;     ///< the group it reduces over
    std::size_t pending = 0;          ///< gradients not yet ready in this window
    bool launched = false;            ///< its reduction began in this window
    WorkPtr work;
  };

  void before_accumulation(std::size_t i, bool own);
  void after_accumulation(std::size_t i, bool own);
  void discard(std::size_t i);
  /// Adds a gradient the trainer's .grad held into the bucket (fp16: refused when it
  /// came from another backward, whose loss scale is not ours).
  void absorb_live(std::size_t i);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void reduce_late_gradients();
  torch::Tensor region(const torch::Tensor& flat, std::size_t i) const;

  std::vector<torch::Tensor> params_;
  std::vector<std::size_t> bucket_of_param_;
  std::vector<Communicator*> comm_of_param_;
  std::vector<std::int64_t> offset_of_param_;  ///< element offset within its bucket
  std::vector<Bucket> buckets_;
  std::unique_ptr<zero::GradientLedger> ledger_;
  Communicator& comm_;
  Tracer& tracer_;
  std::int64_t gradient_bytes_ = 0;
  std::int64_t reduced_bytes_ = 0;
  std::int64_t buffer_bytes_ = 0;
  std::int64_t late_reductions_ = 0;

  bool overlap_ = true;
  bool reduces_ = true;  ///< the group has more than one rank
  bool armed_ = false;   ///< this window's reducing backward has begun
  std::size_t next_to_launch_ = 0;
};

}  // namespace parallax
