// Dense references for the tensor-parallel tests.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>

namespace dense_reference {

// Causal attention with `kv_heads` key/value heads, each shared by heads/kv_heads query
// heads, computed densely.
inline torch::Tensor dense_attention(
    torch::nn::Linear qkv, torch::nn::Linear proj, std::int64_t heads, std::int64_t kv_heads, const torch::Tensor& x) {
  const std::int64_t batch = x.size(0), seq = x.size(1);
  const std::int64_t head_dim = qkv->weight.size(0) / (heads + 2 * kv_heads);
  auto parts = qkv->forward(x).split({heads * head_dim, kv_heads * head_dim, kv_heads * head_dim}, -1);
  auto split = [&](const torch::Tensor& t) { return t.view({batch, seq, -1, head_dim}).transpose(1, 2); };
  const auto k = split(parts[1]).repeat_interleave(heads / kv_heads, 1);
  const auto v = split(parts[2]).repeat_interleave(heads / kv_heads, 1);
  const auto scores = torch::matmul(split(parts[0]), k.transpose(-2, -1)) / std::sqrt(double(head_dim));
  const auto future = torch::ones({seq, seq}, torch::kBool).triu(1);
  const auto attention = torch::softmax(scores.masked_fill(future, -INFINITY), -1);
  return proj->forward(torch::matmul(attention, v).transpose(1, 2).reshape({batch, seq, -1}));
}

}  // namespace dense_reference
