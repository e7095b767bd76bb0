// Context-parallel attention by the method the options name: the one call a model (or
// the engine's interception of scaled_dot_product_attention) makes.
//
//   SequenceSplit split(seq_len, cp.size());
//   AttentionOptions options;
//   options.method = AttentionMethod::kAllToAll;
//   torch::Tensor out = context_attention(q, k, v, cp, split, options);
#pragma once

#include <torch/types.h>

#include "parallax/context_parallel/attention_options.h"
#include "parallax/context_parallel/sequence_split.h"
#include "parallax/core/communicator.h"

namespace parallax::context_parallel {

/// ring_attention or all_to_all_attention, as `options.method` says; their contracts.
torch::Tensor context_attention(const torch::Tensor& q,
                                const torch::Tensor& k,
                                const torch::Tensor& v,
                                Communicator& cp,
                                const SequenceSplit& split,
                                const AttentionOptions& options = {});

namespace detail {
/// The checks both methods make: UsageError unless split.cp() == cp.size(), q, k, v are
/// 4-d CPU tensors of one floating dtype, share batch and head_dim, hold
/// split.local_len() positions, and the key/value heads divide the query heads.
/// `method` names the caller.
void check_attention_inputs(const char* method,
                            const torch::Tensor& q,
                            const torch::Tensor& k,
                            const torch::Tensor& v,
                            const Communicator& cp,
                            const SequenceSplit& split);
/// options.scale, or 1/√head_dim when it is 0.
double attention_scale(const AttentionOptions& options, std::int64_t head_dim);
/// What scores and merges are computed in for inputs of `t`'s dtype: float32 for
/// 16-bit inputs, their own dtype otherwise.
torch::Dtype accumulation_dtype(const torch::Tensor& t);
}  // namespace detail

}  // namespace parallax::context_parallel
