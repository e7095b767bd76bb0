// A transformer block's two halves split over a tensor-parallel group, Megatron style:
// causal self-attention with its heads split (q, k and v column-parallel, the output
// projection row-parallel) and the MLP (column-parallel up, row-parallel down). Each
// takes a replicated [batch, seq, d] input and returns the replicated output, with one
// all-reduce in forward and one in backward.
//
// Both are built from the dense layers of an ordinary block, whose weights they slice,
// so they compute the dense block's function. The attention takes a fused projection
// (Linear(d, (heads + 2·kv_heads)·head_dim) producing [q | k | v]) and slices each part:
// rank r holds query heads [r·h/tp, (r+1)·h/tp). Grouped-query attention (kv_heads <
// heads, each key/value head shared by heads/kv_heads query heads): when tp divides
// kv_heads, the key/value heads split the same way; when kv_heads divides tp, rank r
// holds key/value head r·kv_heads/tp, replicated on the tp/kv_heads ranks whose query
// heads use it, and the partial weight gradients of those copies are summed over them
// in backward (one more all-reduce over the group, of kv_heads × this rank's key/value
// weights: each rank fills its head's slot; the mesh has no communicator per head).
//
//   ParallelCausalSelfAttention attention(dense_qkv, dense_proj, /*heads=*/8, /*kv_heads=*/2, tp);
//   ParallelMLP mlp(dense_fc, dense_proj2, tp);
//   x = x + attention(ln1(x));  x = x + mlp(ln2(x));
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "parallax/core/communicator.h"
#include "parallax/tensor_parallel/parallel_linear.h"
#include "parallax/tensor_parallel/rng_tracker.h"

namespace parallax::tensor_parallel {

class ParallelCausalSelfAttentionImpl : public torch::nn::Module {
 public:
  /// `qkv`: Linear(d, (heads + 2·kv_heads)·head_dim) → [q | k | v]; `proj`:
  /// Linear(heads·head_dim, d). Throws UsageError when heads do not split over tp,
  /// kv_heads does not divide heads, or tp and kv_heads divide neither way. Does not
  /// communicate.
  ParallelCausalSelfAttentionImpl(const torch::nn::Linear& qkv,
                                  const torch::nn::Linear& proj,
                                  std::int64_t heads,
                                  std::int64_t kv_heads,
                                  Communicator& tp);
  /// Multi-head attention: kv_heads = heads.
  ParallelCausalSelfAttentionImpl(const torch::nn::Linear& qkv,
                                  const torch::nn::Linear& proj,
                                  std::int64_t heads,
                                  Communicator& tp)
      : ParallelCausalSelfAttentionImpl(qkv, proj, heads, heads, tp) {}
  /// [batch, seq, d], identical on every rank → the same, identical on every rank.
  torch::Tensor forward(const torch::Tensor& x);

  /// In training, drop attention weights with probability `p`, drawn from `rng`'s
  /// kSplitStream: each rank's heads independently, reproducibly from its seed. `rng`
  /// must outlive the layer. Throws UsageError unless 0 <= p < 1.
  void dropout_attention(double p, RngTracker& rng);

  /// Ranks of the group holding the same key/value weights: 1 when they split, tp /
  /// kv_heads when replicated.
  std::int64_t kv_copies() const { return kv_copies_; }

  torch::Tensor q_weight, q_bias;    ///< this rank's query heads: [local_heads·head_dim, d]
  torch::Tensor kv_weight, kv_bias;  ///< this rank's key/value heads: [2·local_kv·head_dim, d], [k | v]
  RowParallelLinear proj{nullptr};

 private:
  Communicator* tp_;
  std::int64_t local_heads_ = 0;
  std::int64_t local_kv_heads_ = 0;
  std::int64_t head_dim_ = 0;
  std::int64_t kv_copies_ = 1;
  std::int64_t kv_slot_ = 0;  ///< which replicated key/value head this rank holds
  std::int64_t kv_slots_ = 1;
  double dropout_ = 0.0;
  RngTracker* rng_ = nullptr;
};
TORCH_MODULE(ParallelCausalSelfAttention);

class ParallelMLPImpl : public torch::nn::Module {
 public:
  /// `up`: Linear(d, f), `down`: Linear(f, d), GELU between. Throws UsageError when f
  /// does not divide by tp.size(). Does not communicate.
  ParallelMLPImpl(const torch::nn::Linear& up, const torch::nn::Linear& down, Communicator& tp);
  /// [..., d], identical on every rank → the same, identical on every rank.
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear up{nullptr};
  RowParallelLinear down{nullptr};
};
TORCH_MODULE(ParallelMLP);

}  // namespace parallax::tensor_parallel
