#include "parallax/runtime/layer_profile.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "parallax/core/communicator.h"

namespace parallax {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

at::ScalarType scalar_type_of(Dtype dtype) {
  return dtype == Dtype::kBf16 ? at::kBFloat16 : dtype == Dtype::kFp16 ? at::kHalf : at::kFloat;
}

at::Tensor parameter(std::vector<std::int64_t> sizes, at::ScalarType type) {
  return (at::randn(sizes, at::kFloat) * 0.02).to(type).requires_grad_(true);
}

// The median of three (after one warm-up) forward and backward times of `forward`'s
// output summed. The median, not the best: with more ranks than cores the best is a run
// whose neighbours happened to wait, which training does not see.
template <typename Forward>
planner::LayerTimes time_layer(Forward&& forward) {
  std::vector<double> forwards, backwards;
  for (int run = 0; run < 4; ++run) {
    const auto start = Clock::now();
    at::Tensor loss = forward();
    const double forward_s = seconds_since(start);
    const auto middle = Clock::now();
    loss.backward();
    const double backward_s = seconds_since(middle);
    if (run == 0) continue;
    forwards.push_back(forward_s);
    backwards.push_back(backward_s);
  }
  std::sort(forwards.begin(), forwards.end());
  std::sort(backwards.begin(), backwards.end());
  return {forwards[forwards.size() / 2], backwards[backwards.size() / 2]};
}

// One pre-LayerNorm GPT block as examples/gpt builds it, on one of `tp` ranks: qkv and
// the MLP's first layer split by columns, the projections by rows.
planner::LayerTimes time_block(const planner::TransformerShape& m, std::int64_t micro_batch, int tp,
                               at::ScalarType type) {
  const std::int64_t h = m.hidden, kv = m.kv_width() / tp, q = h / tp, f = m.ffn_width() / tp;
  const std::int64_t heads = m.heads / tp, head_dim = h / m.heads;
  const at::Tensor x = at::randn({micro_batch, m.seq, h}, at::kFloat).to(type).requires_grad_(true);
  const at::Tensor ln1_w = parameter({h}, type), ln1_b = parameter({h}, type);
  const at::Tensor ln2_w = parameter({h}, type), ln2_b = parameter({h}, type);
  const at::Tensor w_qkv = parameter({q + 2 * kv, h}, type), b_qkv = parameter({q + 2 * kv}, type);
  const at::Tensor w_proj = parameter({h, q}, type), b_proj = parameter({h}, type);
  const at::Tensor w_fc = parameter({f, h}, type), b_fc = parameter({f}, type);
  const at::Tensor w_out = parameter({h, f}, type), b_out = parameter({h}, type);
  const at::Tensor future = at::ones({m.seq, m.seq}, at::kBool).triu(1);
  return time_layer([&] {
    const at::Tensor a = at::layer_norm(x, {h}, ln1_w, ln1_b);
    const std::vector<at::Tensor> parts = at::linear(a, w_qkv, b_qkv).split_with_sizes({q, kv, kv}, -1);
    const auto split_heads = [&](const at::Tensor& t) {
      return t.view({micro_batch, m.seq, -1, head_dim}).transpose(1, 2);
    };
    at::Tensor k = split_heads(parts[1]), v = split_heads(parts[2]);
    if (k.size(1) != heads) {  // grouped keys and values: each serves heads / kv_heads queries
      k = k.repeat_interleave(heads / k.size(1), 1);
      v = v.repeat_interleave(heads / v.size(1), 1);
    }
    const at::Tensor scores = at::matmul(split_heads(parts[0]), k.transpose(-2, -1)) / std::sqrt(double(head_dim));
    const at::Tensor attention = at::softmax(scores.masked_fill(future, -INFINITY), -1);
    const at::Tensor y = at::matmul(attention, v).transpose(1, 2).reshape({micro_batch, m.seq, q});
    const at::Tensor h1 = x + at::linear(y, w_proj, b_proj);
    const at::Tensor g = at::gelu(at::linear(at::layer_norm(h1, {h}, ln2_w, ln2_b), w_fc, b_fc));
    return (h1 + at::linear(g, w_out, b_out)).sum();
  });
}

// The final LayerNorm, the LM head (its vocabulary split over tp) and the loss in fp32.
planner::LayerTimes time_head(const planner::TransformerShape& m, std::int64_t micro_batch, int tp,
                              at::ScalarType type) {
  const std::int64_t h = m.hidden, vocab = m.vocab / tp;
  const at::Tensor x = at::randn({micro_batch, m.seq, h}, at::kFloat).to(type).requires_grad_(true);
  const at::Tensor ln_w = parameter({h}, type), ln_b = parameter({h}, type);
  const at::Tensor w = parameter({vocab, h}, type);
  const at::Tensor targets = at::randint(vocab, {micro_batch * m.seq}, at::kLong);
  return time_layer([&] {
    const at::Tensor logits = at::linear(at::layer_norm(x, {h}, ln_w, ln_b), w);
    return at::cross_entropy_loss(logits.reshape({-1, vocab}).to(at::kFloat), targets);
  });
}

}  // namespace

LayerProfile profile_layers(const planner::TransformerShape& model,
                            Dtype dtype,
                            const std::vector<std::int64_t>& micro_batches,
                            const std::vector<int>& tps,
                            Communicator& comm) {
  const at::ScalarType type = scalar_type_of(dtype);
  std::vector<std::pair<std::int64_t, int>> shapes;
  for (int tp : tps) {
    const std::int64_t kv_heads = model.kv_heads > 0 ? model.kv_heads : model.heads;
    if (model.heads % tp != 0 || kv_heads % tp != 0 || model.ffn_width() % tp != 0 || model.vocab % tp != 0) continue;
    for (std::int64_t micro_batch : micro_batches) shapes.emplace_back(micro_batch, tp);
  }
  // Every rank times the same shapes at once; rank 0's figures are everyone's.
  at::Tensor times = at::zeros({static_cast<std::int64_t>(shapes.size()), 4}, at::kDouble);
  comm.barrier()->wait();
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const planner::LayerTimes block = time_block(model, shapes[i].first, shapes[i].second, type);
    const planner::LayerTimes head = time_head(model, shapes[i].first, shapes[i].second, type);
    double* row = times[static_cast<std::int64_t>(i)].data_ptr<double>();
    row[0] = block.forward;
    row[1] = block.backward;
    row[2] = head.forward;
    row[3] = head.backward;
  }
  // The mean over ranks (each saw its own neighbours), then rank 0's copy of it for
  // everyone, so every rank plans from bit-identical figures.
  comm.all_reduce(times)->wait();
  times.div_(comm.size());
  comm.broadcast(times, 0)->wait();
  LayerProfile profile;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const double* row = times[static_cast<std::int64_t>(i)].data_ptr<double>();
    profile.block[shapes[i]] = {row[0], row[1]};
    profile.head[shapes[i]] = {row[2], row[3]};
  }
  return profile;
}

}  // namespace parallax
