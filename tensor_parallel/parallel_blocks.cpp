#include "parallax/tensor_parallel/parallel_blocks.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "parallax/core/autograd_context.h"
#include "parallax/core/error.h"
#include "parallax/tensor_parallel/regions.h"

namespace parallax::tensor_parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Forward: copies of `weight` and `bias` (may be undefined). Backward: their gradients
// summed over the ranks that hold the same copies (slot `slot` of `slots`), through one
// all-reduce over the whole group of a [slots, n] tensor in which each rank fills its
// own slot.
struct SumOverCopies : torch::autograd::Function<SumOverCopies> {
  static tensor_list forward(AutogradContext* ctx,
                             const torch::Tensor& weight,
                             const torch::Tensor& bias,
                             Communicator* tp,
                             std::int64_t slot,
                             std::int64_t slots) {
    parallax::detail::remember(ctx, *tp);
    ctx->saved_data["slot"] = slot;
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["has_bias"] = bias.defined();
    return {weight.clone(), bias.defined() ? bias.clone() : torch::zeros({0}, weight.options())};
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    Communicator& tp = parallax::detail::recall(ctx);
    const std::int64_t slot = ctx->saved_data["slot"].toInt();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const torch::Tensor& weight_grad = grads[0];
    const torch::Tensor bias_grad = has_bias ? grads[1].reshape({-1}) : torch::zeros({0}, weight_grad.options());
    const std::int64_t n = weight_grad.numel() + bias_grad.numel();
    torch::Tensor all = torch::zeros({ctx->saved_data["slots"].toInt(), n}, weight_grad.options());
    all[slot].copy_(torch::cat({weight_grad.reshape({-1}), bias_grad}));
    tp.all_reduce(all)->wait();
    const torch::Tensor mine = all[slot];
    return {mine.narrow(0, 0, weight_grad.numel()).view_as(weight_grad).clone(),
            has_bias ? mine.narrow(0, weight_grad.numel(), bias_grad.numel()).clone() : torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Rows [first·width, (first + count)·width) of `t` (a weight or bias), as a new leaf.
torch::Tensor heads_of(const torch::Tensor& t, std::int64_t first, std::int64_t count, std::int64_t width) {
  return t.detach().narrow(0, first * width, count * width).clone();
}

}  // namespace

ParallelCausalSelfAttentionImpl::ParallelCausalSelfAttentionImpl(const torch::nn::Linear& qkv_dense,
                                                                 const torch::nn::Linear& proj_dense,
                                                                 std::int64_t heads,
                                                                 std::int64_t kv_heads,
                                                                 Communicator& tp)
    : tp_(&tp) {
  const std::int64_t ranks = tp.size(), rank = tp.rank();
  PARALLAX_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, UsageError, "kv_heads = ", kv_heads,
                 " must divide heads = ", heads, " (each key/value head serves heads / kv_heads query heads)");
  PARALLAX_CHECK(heads % ranks == 0, UsageError, heads, " attention heads do not split over the ", ranks,
                 " ranks of tensor-parallel group '", tp.name(), "'");
  PARALLAX_CHECK(kv_heads % ranks == 0 || ranks % kv_heads == 0, UsageError, kv_heads,
                 " key/value heads neither split over nor divide the ", ranks, " ranks of tensor-parallel group '",
                 tp.name(), "'");
  const std::int64_t outputs = qkv_dense->weight.size(0);
  PARALLAX_CHECK(outputs % (heads + 2 * kv_heads) == 0, UsageError, "a fused projection of ", outputs,
                 " outputs is not (heads + 2·kv_heads) = ", heads + 2 * kv_heads, " heads of equal width");
  head_dim_ = outputs / (heads + 2 * kv_heads);
  local_heads_ = heads / ranks;
  if (kv_heads % ranks == 0) {
    local_kv_heads_ = kv_heads / ranks;
    kv_slot_ = rank * local_kv_heads_;
  } else {
    local_kv_heads_ = 1;
    kv_copies_ = ranks / kv_heads;
    kv_slot_ = rank / kv_copies_;
    kv_slots_ = kv_heads;
  }
  const torch::Tensor& w = qkv_dense->weight;
  const std::int64_t k_first = heads, v_first = heads + kv_heads;  // in heads, along the fused rows
  q_weight = register_parameter("q_weight", heads_of(w, rank * local_heads_, local_heads_, head_dim_));
  kv_weight =
      register_parameter("kv_weight", torch::cat({heads_of(w, k_first + kv_slot_, local_kv_heads_, head_dim_),
                                                  heads_of(w, v_first + kv_slot_, local_kv_heads_, head_dim_)}));
  if (const torch::Tensor& b = qkv_dense->bias; b.defined()) {
    q_bias = register_parameter("q_bias", heads_of(b, rank * local_heads_, local_heads_, head_dim_));
    kv_bias = register_parameter("kv_bias", torch::cat({heads_of(b, k_first + kv_slot_, local_kv_heads_, head_dim_),
                                                        heads_of(b, v_first + kv_slot_, local_kv_heads_, head_dim_)}));
  }
  proj = register_module("proj", RowParallelLinear(proj_dense, tp, /*input_is_parallel=*/true));
}

torch::Tensor ParallelCausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  const std::int64_t batch = x.size(0), seq = x.size(1);
  const torch::Tensor input = copy_to_region(x, *tp_);  // one input gradient all-reduce for q, k and v
  torch::Tensor w = kv_weight, b = kv_bias;
  if (kv_copies_ > 1) {
    const auto copies = SumOverCopies::apply(kv_weight, kv_bias, tp_, kv_slot_, kv_slots_);
    w = copies[0];
    b = kv_bias.defined() ? copies[1] : torch::Tensor();
  }
  const torch::Tensor q_flat = F::linear(input, q_weight, q_bias);
  const auto kv = F::linear(input, w, b).chunk(2, -1);
  auto heads = [&](const torch::Tensor& t) { return t.view({batch, seq, -1, head_dim_}).transpose(1, 2); };
  const std::int64_t group = local_heads_ / local_kv_heads_;  // query heads per key/value head here
  const torch::Tensor q = heads(q_flat);
  const torch::Tensor k = heads(kv[0]).repeat_interleave(group, 1);
  const torch::Tensor v = heads(kv[1]).repeat_interleave(group, 1);
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  const torch::Tensor future = torch::ones({seq, seq}, scores.options().dtype(torch::kBool)).triu(1);
  torch::Tensor attention = torch::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  if (dropout_ > 0.0 && is_training()) {
    auto split = rng_->fork(kSplitStream);  // these are this rank's heads only
    attention = torch::dropout(attention, dropout_, /*train=*/true);
  }
  const torch::Tensor y = torch::matmul(attention, v).transpose(1, 2).reshape({batch, seq, -1});
  return proj(y);
}

void ParallelCausalSelfAttentionImpl::dropout_attention(double p, RngTracker& rng) {
  PARALLAX_CHECK(p >= 0.0 && p < 1.0, UsageError, "attention dropout ", p, ": expected 0 <= p < 1");
  dropout_ = p;
  rng_ = &rng;
}

ParallelMLPImpl::ParallelMLPImpl(const torch::nn::Linear& up_dense,
                                 const torch::nn::Linear& down_dense,
                                 Communicator& tp) {
  up = register_module("up", ColumnParallelLinear(up_dense, tp, /*gather_output=*/false));
  down = register_module("down", RowParallelLinear(down_dense, tp, /*input_is_parallel=*/true));
}

torch::Tensor ParallelMLPImpl::forward(const torch::Tensor& x) {
  return down(torch::gelu(up(x)));
}

}  // namespace parallax::tensor_parallel
