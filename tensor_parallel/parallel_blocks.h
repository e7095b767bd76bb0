// A transformer block's two halves split over a tensor-parallel group, Megatron style:
// causal self-attention with its heads split (q, k and v column-parallel, the output
// projection row-parallel) and the MLP (column-parallel up, row-parallel down). Each
// takes a replicated [batch, seq, d] input and returns the replicated output, with one
// all-reduce in forward and one in backward.
//
// Both are built from the dense layers of an ordinary block, whose weights they slice,
// so they compute the dense block's function. A fused qkv projection (Linear(d, 3d)
// producing [q | k | v]) is sliced per part: rank r takes heads [r·h/tp, (r+1)·h/tp)
// of q, of k and of v.
//
//   ParallelCausalSelfAttention attention(dense_qkv, dense_proj, /*heads=*/8, tp);
//   ParallelMLP mlp(dense_fc, dense_proj2, tp);
//   x = x + attention(ln1(x));  x = x + mlp(ln2(x));
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "parallax/core/communicator.h"
#include "parallax/tensor_parallel/parallel_linear.h"

namespace parallax::tensor_parallel {

/// A copy of `fused` (a Linear whose outputs are `parts` equal blocks, e.g. [q | k | v])
/// with its output rows reordered so that splitting them into tp equal chunks gives
/// rank r the r-th slice of every block, in block order. Throws UsageError when a block
/// does not divide by tp.
torch::nn::Linear interleave_fused_outputs(const torch::nn::Linear& fused, std::int64_t parts, int tp);

class ParallelCausalSelfAttentionImpl : public torch::nn::Module {
 public:
  /// `qkv`: Linear(d, 3d) → [q | k | v]; `proj`: Linear(d, d); `heads` heads of d/heads.
  /// Throws UsageError when heads do not divide by tp.size(). Does not communicate.
  ParallelCausalSelfAttentionImpl(const torch::nn::Linear& qkv,
                                  const torch::nn::Linear& proj,
                                  std::int64_t heads,
                                  Communicator& tp);
  /// [batch, seq, d], identical on every rank → the same, identical on every rank.
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear qkv{nullptr};
  RowParallelLinear proj{nullptr};

 private:
  std::int64_t local_heads_;
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
