// The conjugate communication functions of Megatron-style tensor parallelism: each is
// an autograd function whose backward is the other's forward, so a layer built from
// them is differentiated correctly without any hand-written gradient reduction.
//
//   forward                          backward
//   copy_to_region:     identity     all-reduce (sum) over tp
//   reduce_from_region: all-reduce   identity
//   scatter_to_region:  own 1/tp of the last dimension    all-gather of it
//   gather_from_region: all-gather of the last dimension  own 1/tp of it
//   gather_from_sequence_region:  all-gather along dim     reduce-scatter along dim
//   reduce_scatter_to_sequence_region: reduce-scatter      all-gather
// The last pair is sequence parallelism's: around a TP region, activations sharded
// along the sequence are gathered on entry and reduce-scattered on exit, in place of
// copy_to_region / reduce_from_region (the same bytes, and no replicated activations).
//
// Every rank of `tp` must call the same functions in the same order (they are
// collectives, in forward and again in backward); each blocks until its collective is
// done and throws CommError when it fails or times out.
//
//   y = reduce_from_region(torch::matmul(copy_to_region(x, tp), w_shard.t()), tp);
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "parallax/core/communicator.h"

namespace parallax::tensor_parallel {

/// Forward: `input` unchanged. Backward: the gradient summed over `tp`.
torch::Tensor copy_to_region(const torch::Tensor& input, Communicator& tp);
/// Forward: `input` summed over `tp`. Backward: the gradient unchanged.
torch::Tensor reduce_from_region(const torch::Tensor& input, Communicator& tp);
/// Forward: rank r's r-th of tp equal parts of the last dimension (throws UsageError
/// when it does not divide). Backward: the gradient all-gathered along it.
torch::Tensor scatter_to_region(const torch::Tensor& input, Communicator& tp);
/// Forward: every rank's `input` concatenated along the last dimension, in rank order.
/// Backward: this rank's part of the gradient.
torch::Tensor gather_from_region(const torch::Tensor& input, Communicator& tp);
/// Forward: every rank's `input` concatenated along `dim`, in rank order. Backward: the
/// gradient summed over `tp`, this rank's part along `dim` (a reduce-scatter).
torch::Tensor gather_from_sequence_region(const torch::Tensor& input, Communicator& tp, std::int64_t dim = 0);
/// Forward: `input` summed over `tp`, this rank's part along `dim` (throws UsageError
/// when it does not divide). Backward: the gradient all-gathered along `dim`.
torch::Tensor reduce_scatter_to_sequence_region(const torch::Tensor& input, Communicator& tp, std::int64_t dim = 0);

}  // namespace parallax::tensor_parallel
