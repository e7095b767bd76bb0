#include "parallax/tensor_parallel/parallel_blocks.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "parallax/core/error.h"

namespace parallax::tensor_parallel {

torch::nn::Linear interleave_fused_outputs(const torch::nn::Linear& fused, std::int64_t parts, int tp) {
  const std::int64_t outputs = fused->weight.size(0);
  PARALLAX_CHECK(outputs % (parts * tp) == 0, UsageError, "a fused projection of ", outputs, " outputs in ", parts,
                 " parts does not split over ", tp, " tensor-parallel ranks");
  const std::int64_t slice = outputs / parts / tp;
  std::vector<std::int64_t> order;
  for (int r = 0; r < tp; ++r) {
    for (std::int64_t p = 0; p < parts; ++p) {
      for (std::int64_t i = 0; i < slice; ++i) order.push_back((p * tp + r) * slice + i);
    }
  }
  const torch::Tensor index = torch::tensor(order, torch::kLong);
  torch::nn::Linear out(torch::nn::LinearOptions(fused->weight.size(1), outputs).bias(fused->bias.defined()));
  torch::NoGradGuard no_grad;
  out->weight.copy_(fused->weight.index_select(0, index));
  if (fused->bias.defined()) out->bias.copy_(fused->bias.index_select(0, index));
  return out;
}

ParallelCausalSelfAttentionImpl::ParallelCausalSelfAttentionImpl(const torch::nn::Linear& qkv_dense,
                                                                 const torch::nn::Linear& proj_dense,
                                                                 std::int64_t heads,
                                                                 Communicator& tp) {
  PARALLAX_CHECK(heads % tp.size() == 0, UsageError, heads, " attention heads do not split over the ", tp.size(),
                 " ranks of tensor-parallel group '", tp.name(), "'");
  local_heads_ = heads / tp.size();
  qkv = register_module("qkv", ColumnParallelLinear(interleave_fused_outputs(qkv_dense, 3, tp.size()), tp, false));
  proj = register_module("proj", RowParallelLinear(proj_dense, tp, /*input_is_parallel=*/true));
}

torch::Tensor ParallelCausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const std::int64_t batch = x.size(0), seq = x.size(1);
  auto parts = qkv(x).chunk(3, -1);  // this rank's heads of q, k and v
  const std::int64_t local_width = parts[0].size(-1);
  const std::int64_t head_dim = local_width / local_heads_;
  auto heads = [&](const torch::Tensor& t) { return t.view({batch, seq, local_heads_, head_dim}).transpose(1, 2); };
  const torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  const torch::Tensor future = torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  const torch::Tensor attention =
      torch::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  const torch::Tensor y = torch::matmul(attention, v).transpose(1, 2).contiguous().view({batch, seq, local_width});
  return proj(y);
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
