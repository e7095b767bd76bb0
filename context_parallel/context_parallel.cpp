#include "parallax/context_parallel/context_parallel.h"

#include "parallax/context_parallel/attention.h"
#include "parallax/context_parallel/sdpa_interception.h"
#include "parallax/core/error.h"

namespace parallax::context_parallel {
namespace {
thread_local const ContextParallel* current_handle = nullptr;
}  // namespace

ContextParallel::ContextParallel(Communicator& group,
                                 AttentionOptions options,
                                 bool load_balance,
                                 std::int64_t sequence_dim)
    : group_(&group), options_(options), load_balance_(load_balance), sequence_dim_(sequence_dim) {
  options_.counters = &counters_;
}

torch::Tensor ContextParallel::local_part(const torch::Tensor& whole) const {
  PARALLAX_CHECK(whole.dim() > sequence_dim_, UsageError, "context parallelism splits dimension ", sequence_dim_,
                 " (context_parallel.sequence_dim) of the batch, but a tensor of shape ", whole.sizes(), " has none");
  return split(whole.size(sequence_dim_)).local_part(whole, rank(), sequence_dim_);
}

torch::Tensor ContextParallel::positions(std::int64_t local_len) const {
  return split(local_len * size()).positions(rank());
}

torch::Tensor ContextParallel::attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const {
  return attention(q, k, v, options_.causal, options_.scale);
}

torch::Tensor ContextParallel::attention(const torch::Tensor& q,
                                         const torch::Tensor& k,
                                         const torch::Tensor& v,
                                         bool causal,
                                         double scale) const {
  AttentionOptions options = options_;
  options.causal = causal;
  options.scale = scale;
  return context_attention(q, k, v, *group_, split(q.size(2) * size()), options);
}

ContextParallel::Scope::Scope(const ContextParallel& handle)
    : previous_(current_handle), intercepting_(intercept_sdpa(handle)) {
  current_handle = &handle;
}

ContextParallel::Scope::~Scope() {
  current_handle = previous_;
}

const ContextParallel* current() {
  return current_handle;
}

}  // namespace parallax::context_parallel
