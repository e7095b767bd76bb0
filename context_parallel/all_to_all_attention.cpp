#include "parallax/context_parallel/all_to_all_attention.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <limits>
#include <vector>

#include "parallax/context_parallel/attention.h"
#include "parallax/core/autograd_context.h"
#include "parallax/core/error.h"
#include "parallax/core/operator_interception.h"

namespace parallax::context_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int kToHeadsTag = 4111;
constexpr int kToSequenceTag = 4112;

// out[j] = rank j's parts[r]: each rank's j-th part goes to rank j. `parts` is [C, ...].
// Every receive is posted before the sends; the own part is copied, not sent.
torch::Tensor exchanged(const torch::Tensor& parts, Communicator& cp, int tag) {
  const int C = cp.size(), r = cp.rank();
  torch::Tensor out = torch::empty_like(parts);
  out[r].copy_(parts[r]);
  std::vector<WorkPtr> pending;
  for (int peer = 0; peer < C; ++peer) {
    if (peer == r) continue;
    torch::Tensor slot = out[peer];
    pending.push_back(cp.recv(slot, peer, tag));
  }
  for (int peer = 0; peer < C; ++peer) {
    if (peer != r) pending.push_back(cp.send(parts[peer], peer, tag));
  }
  for (auto& work : pending) work->wait();
  return out;
}

// [B, H, L, D], L this rank's positions → [B, H/C, C·L, D]: head group r of every rank's
// positions, rank by rank.
torch::Tensor sequence_to_heads(const torch::Tensor& x, Communicator& cp) {
  const int C = cp.size();
  const std::int64_t B = x.size(0), H = x.size(1), L = x.size(2), D = x.size(3);
  const torch::Tensor parts = x.reshape({B, C, H / C, L, D}).permute({1, 0, 2, 3, 4}).contiguous();
  return exchanged(parts, cp, kToHeadsTag).permute({1, 2, 0, 3, 4}).reshape({B, H / C, C * L, D});
}

// The inverse: [B, H/C, C·L, D] → [B, H, L, D].
torch::Tensor heads_to_sequence(const torch::Tensor& y, Communicator& cp) {
  const int C = cp.size();
  const std::int64_t B = y.size(0), Hc = y.size(1), L = y.size(2) / C, D = y.size(3);
  const torch::Tensor parts = y.reshape({B, Hc, C, L, D}).permute({2, 0, 1, 3, 4}).contiguous();
  return exchanged(parts, cp, kToSequenceTag).permute({1, 0, 2, 3, 4}).reshape({B, C * Hc, L, D});
}

// One exchange as an autograd function: forward moves `x` one way (to the head split,
// or back to the sequence split), backward moves its gradient the other way.
struct Exchange : torch::autograd::Function<Exchange> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* cp, bool to_heads) {
    parallax::detail::remember(ctx, *cp);
    ctx->saved_data["to_heads"] = to_heads;
    return to_heads ? sequence_to_heads(x, *cp) : heads_to_sequence(x, *cp);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    Communicator& cp = parallax::detail::recall(ctx);
    const torch::Tensor grad = grads[0].contiguous();
    return {ctx->saved_data["to_heads"].toBool() ? heads_to_sequence(grad, cp) : sequence_to_heads(grad, cp),
            torch::Tensor(), torch::Tensor()};
  }
};

// Attention of this rank's heads over the whole sequence, listed rank by rank as `split`
// places it. LibTorch 2.x: its fused kernel (scaled_dot_product_attention: no scores kept
// for backward), the load-balanced sequence put in position order for the causal mask
// and back; 1.13: scores, the mask built from the positions, softmax, in the
// accumulation dtype.
torch::Tensor whole_sequence_attention(const torch::Tensor& qh,
                                       const torch::Tensor& kh,
                                       const torch::Tensor& vh,
                                       const SequenceSplit& split,
                                       bool causal,
                                       double scale) {
#if TORCH_VERSION_MAJOR >= 2
  // The engine's interception of this operator must not see the call it serves.
  const interception::Paused not_intercepted(interception::Layer::kAttention);
  // A contiguous split lists the positions in order; without a mask the order is moot.
  if (!causal || !split.load_balance()) return at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, causal, scale);
  const torch::Tensor positions = split.positions_in_rank_order().to(qh.device());
  const torch::Tensor order = positions.argsort();  // position p's index in the exchanged order
  auto sorted = [&](const torch::Tensor& t) { return t.index_select(2, order); };
  return at::scaled_dot_product_attention(sorted(qh), sorted(kh), sorted(vh), {}, 0.0, true, scale)
      .index_select(2, positions);
#else
  const torch::Dtype acc = detail::accumulation_dtype(qh);
  torch::Tensor scores = torch::matmul(qh.to(acc), kh.to(acc).transpose(-2, -1)) * scale;
  if (causal) {
    const torch::Tensor positions = split.positions_in_rank_order().to(qh.device());
    const torch::Tensor future = positions.unsqueeze(1) < positions.unsqueeze(0);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  return torch::matmul(torch::softmax(scores, -1), vh.to(acc)).to(qh.scalar_type());
#endif
}

}  // namespace

torch::Tensor all_to_all_attention(const torch::Tensor& q,
                                   const torch::Tensor& k,
                                   const torch::Tensor& v,
                                   Communicator& cp,
                                   const SequenceSplit& split,
                                   const AttentionOptions& options) {
  detail::check_attention_inputs("all-to-all", q, k, v, cp, split);
  const int C = cp.size();
  PARALLAX_CHECK(q.size(1) % C == 0 && k.size(1) % C == 0, ConfigError,
                 "context_parallel.method = \"all_to_all\" splits the attention heads over cp = ", C,
                 ", but the model has ", q.size(1), " query heads and ", k.size(1),
                 " key/value heads; both must be multiples of ", C,
                 ". Use context_parallel.method = \"ring\", which takes any head count, or a cp that divides both");
  const torch::Tensor qh = Exchange::apply(q.contiguous(), &cp, /*to_heads=*/true);
  torch::Tensor kh = Exchange::apply(k.contiguous(), &cp, /*to_heads=*/true);
  torch::Tensor vh = Exchange::apply(v.contiguous(), &cp, /*to_heads=*/true);
  const std::int64_t group = q.size(1) / k.size(1);
  if (group > 1) {
    kh = kh.repeat_interleave(group, 1);
    vh = vh.repeat_interleave(group, 1);
  }
  if (options.counters != nullptr) {
    options.counters->score_elements += qh.size(0) * qh.size(1) * qh.size(2) * kh.size(2);
    ++options.counters->calls;
  }
  const torch::Tensor out =
      whole_sequence_attention(qh, kh, vh, split, options.causal, detail::attention_scale(options, q.size(3)));
  return Exchange::apply(out, &cp, /*to_heads=*/false);
}

}  // namespace parallax::context_parallel
