// Megatron's column- and row-parallel linear layers over a tensor-parallel group.
//
// ColumnParallelLinear: y = x·Wᵀ + b with W split by rows (output features): rank r
// holds rows [r·o/tp, (r+1)·o/tp) of W and of b. Its input is replicated (entered
// through copy_to_region, whose backward sums the input gradient over tp); its output
// is this rank's slice of y, or all of y with gather_output.
// RowParallelLinear: W split by columns (input features): rank r holds columns
// [r·i/tp, (r+1)·i/tp). Its input is that slice of x (input_is_parallel) or the whole x,
// split on entry; the partial products are summed over tp (reduce_from_region), then the
// replicated bias is added, so every rank ends with all of y.
// A column layer without gather_output followed by a row layer with input_is_parallel
// (an MLP, attention's projections) communicates once in forward and once in backward.
//
// Both are built from an existing dense torch::nn::Linear, whose weights they slice, so
// the parallel layer computes the dense layer's function exactly (up to summation order).
//
//   ColumnParallelLinear up(dense_up, tp, /*gather_output=*/false);
//   RowParallelLinear down(dense_down, tp, /*input_is_parallel=*/true);
//   auto y = down(torch::gelu(up(x)));   // == dense_down(gelu(dense_up(x)))
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "parallax/core/communicator.h"

namespace parallax::tensor_parallel {

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  /// This rank's rows of `dense` (copied). Throws UsageError when out_features does not
  /// divide by tp.size(). `tp` must outlive the layer. Does not communicate.
  ColumnParallelLinearImpl(const torch::nn::Linear& dense, Communicator& tp, bool gather_output);
  /// `input` [..., in_features], identical on every rank of tp. Collective in backward
  /// (and in forward with gather_output). Returns [..., out_features / tp] or
  /// [..., out_features].
  torch::Tensor forward(const torch::Tensor& input);

  torch::Tensor weight;  ///< [out_features / tp, in_features]
  torch::Tensor bias;    ///< [out_features / tp], undefined without bias

 private:
  Communicator* tp_;
  bool gather_output_;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinear;
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  /// This rank's columns of `dense` (copied) and its whole bias (replicated). Throws
  /// UsageError when in_features does not divide by tp.size(). `tp` must outlive the
  /// layer. Does not communicate.
  RowParallelLinearImpl(const torch::nn::Linear& dense, Communicator& tp, bool input_is_parallel);
  /// `input` [..., in_features / tp] with input_is_parallel, else [..., in_features]
  /// identical on every rank. Collective in forward. Returns [..., out_features],
  /// identical on every rank.
  torch::Tensor forward(const torch::Tensor& input);

  torch::Tensor weight;  ///< [out_features, in_features / tp]
  torch::Tensor bias;    ///< [out_features] (replicated), undefined without bias

 private:
  Communicator* tp_;
  bool input_is_parallel_;
};
TORCH_MODULE(RowParallelLinear);

}  // namespace parallax::tensor_parallel
