#include "parallax/context_parallel/attention.h"

#include <cmath>

#include "parallax/context_parallel/all_to_all_attention.h"
#include "parallax/context_parallel/ring_attention.h"
#include "parallax/core/error.h"

namespace parallax::context_parallel {

const char* to_string(AttentionMethod method) {
  return method == AttentionMethod::kRing ? "ring" : "all_to_all";
}

torch::Tensor context_attention(const torch::Tensor& q,
                                const torch::Tensor& k,
                                const torch::Tensor& v,
                                Communicator& cp,
                                const SequenceSplit& split,
                                const AttentionOptions& options) {
  if (options.method == AttentionMethod::kAllToAll) return all_to_all_attention(q, k, v, cp, split, options);
  return ring_attention(q, k, v, cp, split, options);
}

namespace detail {

void check_attention_inputs(const char* method,
                            const torch::Tensor& q,
                            const torch::Tensor& k,
                            const torch::Tensor& v,
                            const Communicator& cp,
                            const SequenceSplit& split) {
  PARALLAX_CHECK(split.cp() == cp.size(), UsageError, method, " attention over group '", cp.name(), "' (", cp.size(),
                 " ranks) was given a sequence split for cp = ", split.cp());
  PARALLAX_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, UsageError, method,
                 " attention takes [batch, heads, positions, head_dim] tensors, got q ", q.sizes(), ", k ", k.sizes(),
                 ", v ", v.sizes());
  PARALLAX_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(3) == k.size(3) &&
                     q.size(2) == split.local_len() && k.size(2) == split.local_len(),
                 UsageError, method, " attention: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(),
                 " must share batch and head_dim, k and v one shape, and each hold this rank's ", split.local_len(),
                 " of ", split.seq_len(), " positions");
  PARALLAX_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, UsageError, method, " attention: ", q.size(1),
                 " query heads cannot share ", k.size(1), " key/value heads (they must divide)");
  PARALLAX_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() && q.is_floating_point(),
                 UsageError, method, " attention: q, k and v must be of one floating dtype");
  PARALLAX_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), UsageError, method,
                 " attention runs on CPU tensors (context parallelism has not run on a GPU yet); got q on ",
                 q.device());
}

double attention_scale(const AttentionOptions& options, std::int64_t head_dim) {
  return options.scale != 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

torch::Dtype accumulation_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16 ? torch::kFloat : t.scalar_type();
}

}  // namespace detail
}  // namespace parallax::context_parallel
