#include "parallax/context_parallel/ring_attention.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "parallax/context_parallel/attention.h"
#include "parallax/core/autograd_context.h"
#include "parallax/core/error.h"

namespace parallax::context_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Message tags on the cp group: one per kind of message, so a layer's forward ring, its
// backward ring and the gradients travelling back never match each other's receives.
constexpr int kForwardKvTag = 4101;
constexpr int kBackwardKvTag = 4102;
constexpr int kKvGradTag = 4103;

// What one call needs besides its tensors, kept from forward to backward.
struct Geometry {
  std::int64_t seq_len = 0;
  int cp = 1;
  bool load_balance = true;
  bool causal = true;
  double scale = 1;

  SequenceSplit split() const { return SequenceSplit(seq_len, cp, load_balance); }
};

// A run of key chunks of a block that one query chunk attends to in one kernel call:
// chunks [first, first + count) of the block (0 and 1), the one under the triangular mask
// when it is the query's own chunk.
struct Span {
  int first = 0;
  int count = 1;
  bool diagonal = false;
};

// The spans query chunk `query_chunk` attends to in a block holding `block_chunks`:
// earlier chunks whole (both in one call when neither is its own), its own chunk under
// the mask, later chunks skipped whole under a causal mask.
std::vector<Span> spans_of(int query_chunk, const std::array<int, 2>& block_chunks, bool causal) {
  std::vector<Span> spans;
  for (int j = 0; j < 2; ++j) {
    if (causal && block_chunks[j] > query_chunk) continue;
    const bool diagonal = causal && block_chunks[j] == query_chunk;
    if (!diagonal && !spans.empty() && !spans.back().diagonal) {
      ++spans.back().count;
    } else {
      spans.push_back(Span{j, 1, diagonal});
    }
  }
  return spans;
}

// A span's keys or values out of a block's [B, Hkv, 2m, D] tensor, their heads repeated
// for the `group` query heads that share each.
torch::Tensor span_of(const torch::Tensor& block, const Span& span, std::int64_t m, std::int64_t group) {
  const torch::Tensor keys = block.narrow(2, span.first * m, span.count * m);
  return group == 1 ? keys : keys.repeat_interleave(group, 1);
}

// [B, H, ...] summed over the `group` query heads of each key/value head: [B, Hkv, ...].
torch::Tensor summed_over_group(const torch::Tensor& x, std::int64_t group) {
  if (group == 1) return x;
  std::vector<std::int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes[1] /= group;
  sizes.insert(sizes.begin() + 2, group);
  return x.reshape(sizes).sum(2);
}

// One query chunk's attention to a span's keys: its output and the log-sum-exp of each
// query row's scores, in the accumulation dtype; `diagonal`: the span is the query's own
// chunk (the triangular mask). LibTorch 2.x: the fused CPU kernel (no score matrix);
// 1.13: scores and softmax written out.
struct Partial {
  torch::Tensor out, lse;
};

#if TORCH_VERSION_MAJOR < 2
// The scaled scores of q against k (accumulation dtype), the triangle above the diagonal
// masked when `diagonal`.
torch::Tensor masked_scores(const torch::Tensor& q, const torch::Tensor& k, bool diagonal, double scale) {
  const torch::Dtype acc = detail::accumulation_dtype(q);
  torch::Tensor S = torch::matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale;
  if (diagonal) {
    const std::int64_t m = q.size(2);
    S.masked_fill_(torch::ones({m, m}, S.options().dtype(torch::kBool)).triu(1),
                   -std::numeric_limits<double>::infinity());
  }
  return S;
}
#endif

Partial attend_chunk(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool diagonal, double scale) {
  const torch::Dtype acc = detail::accumulation_dtype(q);
#if TORCH_VERSION_MAJOR >= 2
  const auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, diagonal, {}, scale);
  return {out.to(acc), lse.to(acc)};
#else
  const torch::Tensor S = masked_scores(q, k, diagonal, scale);
  const torch::Tensor lse = torch::logsumexp(S, -1);
  return {torch::matmul(torch::exp(S - lse.unsqueeze(-1)), v.to(acc)), lse};
#endif
}

// The gradients (dq, dk, dv, accumulation dtype) of one query chunk's attention to a
// span's keys, from the upstream gradient rows `dout` and the whole attention's output
// rows `out` and log-sum-exp rows `lse` (accumulation dtype).
std::array<torch::Tensor, 3> attend_chunk_backward(const torch::Tensor& dout,
                                                   const torch::Tensor& q,
                                                   const torch::Tensor& k,
                                                   const torch::Tensor& v,
                                                   const torch::Tensor& out,
                                                   const torch::Tensor& lse,
                                                   bool diagonal,
                                                   double scale) {
  const torch::Dtype acc = detail::accumulation_dtype(q);
#if TORCH_VERSION_MAJOR >= 2
  const auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      dout.to(q.scalar_type()), q, k, v, out.to(q.scalar_type()), lse.to(torch::kFloat), 0.0, diagonal, {}, scale);
  return {dq.to(acc), dk.to(acc), dv.to(acc)};
#else
  const torch::Tensor qa = q.to(acc), ka = k.to(acc), va = v.to(acc);
  const torch::Tensor P = torch::exp(masked_scores(qa, ka, diagonal, scale) - lse.unsqueeze(-1));
  // D = rowsum(dO ∘ O): the softmax backward's correction, one per query.
  const torch::Tensor correction = (dout * out).sum(-1);
  const torch::Tensor dS = P * (torch::matmul(dout, va.transpose(-2, -1)) - correction.unsqueeze(-1)) * scale;
  return {torch::matmul(dS, ka), torch::matmul(dS.transpose(-2, -1), qa), torch::matmul(P.transpose(-2, -1), dout)};
#endif
}

int next_rank(const Communicator& cp) {
  return (cp.rank() + 1) % cp.size();
}
int previous_rank(const Communicator& cp) {
  return (cp.rank() + cp.size() - 1) % cp.size();
}

// One hop of a ring: the receive of the next block posted, then the send of `held`.
struct Hop {
  WorkPtr received;
  WorkPtr sent;
  torch::Tensor incoming;

  void wait() {
    received->wait();
    sent->wait();
  }
};

Hop start_hop(Communicator& cp, const torch::Tensor& held, int tag) {
  Hop hop;
  hop.incoming = torch::empty_like(held);
  hop.received = cp.recv(hop.incoming, previous_rank(cp), tag);
  hop.sent = cp.send(held, next_rank(cp), tag);
  return hop;
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(AutogradContext* ctx,
                               const torch::Tensor& q,
                               const torch::Tensor& k,
                               const torch::Tensor& v,
                               Communicator* cp,
                               Geometry g,
                               AttentionCounters* counters) {
    const SequenceSplit split = g.split();
    const std::int64_t m = split.chunk_len(), group = q.size(1) / k.size(1);
    const torch::Dtype acc = detail::accumulation_dtype(q);
    const int C = cp->size(), r = cp->rank();
    const auto my_chunks = split.chunks_of(r);

    std::array<torch::Tensor, 2> out, lse;
    for (int i = 0; i < 2; ++i) {
      out[i] = torch::zeros({q.size(0), q.size(1), m, q.size(3)}, q.options().dtype(acc));
      lse[i] = torch::full({q.size(0), q.size(1), m}, -std::numeric_limits<double>::infinity(), q.options().dtype(acc));
    }
    torch::Tensor held = torch::stack({k, v}).contiguous();  // [2, B, Hkv, 2m, D]
    for (int step = 0; step < C; ++step) {
      const auto block_chunks = split.chunks_of((r - step + C) % C);
      Hop hop;
      if (step + 1 < C) hop = start_hop(*cp, held, kForwardKvTag);
      for (int i = 0; i < 2; ++i) {
        const torch::Tensor qi = q.narrow(2, i * m, m);
        for (const Span& span : spans_of(my_chunks[i], block_chunks, g.causal)) {
          const Partial block = attend_chunk(qi, span_of(held[0], span, m, group), span_of(held[1], span, m, group),
                                             span.diagonal, g.scale);
          const torch::Tensor merged = torch::logaddexp(lse[i], block.lse);
          out[i] = out[i] * torch::exp(lse[i] - merged).unsqueeze(-1) +
                   block.out * torch::exp(block.lse - merged).unsqueeze(-1);
          lse[i] = merged;
          if (counters != nullptr) counters->score_elements += q.size(0) * q.size(1) * m * span.count * m;
        }
      }
      if (step + 1 < C) {
        hop.wait();
        held = hop.incoming;
      }
    }
    if (counters != nullptr) ++counters->calls;

    const torch::Tensor output = torch::cat({out[0], out[1]}, 2);
    ctx->save_for_backward({q, k, v, output, torch::cat({lse[0], lse[1]}, 2)});
    parallax::detail::remember(ctx, *cp);
    ctx->saved_data["seq_len"] = g.seq_len;
    ctx->saved_data["load_balance"] = g.load_balance;
    ctx->saved_data["causal"] = g.causal;
    ctx->saved_data["scale"] = g.scale;
    return output.to(q.scalar_type());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    Communicator& cp = parallax::detail::recall(ctx);
    Geometry g;
    g.seq_len = ctx->saved_data["seq_len"].toInt();
    g.cp = cp.size();
    g.load_balance = ctx->saved_data["load_balance"].toBool();
    g.causal = ctx->saved_data["causal"].toBool();
    g.scale = ctx->saved_data["scale"].toDouble();
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &output = saved[3], &lse_all = saved[4];

    const SequenceSplit split = g.split();
    const std::int64_t m = split.chunk_len(), group = q.size(1) / k.size(1);
    const torch::Dtype acc = detail::accumulation_dtype(q);
    const int C = cp.size(), r = cp.rank();
    const auto my_chunks = split.chunks_of(r);
    const torch::Tensor dout = grads[0].to(acc);
    torch::Tensor dq = torch::zeros(q.sizes(), q.options().dtype(acc));

    torch::Tensor held = torch::stack({k, v}).contiguous();
    torch::Tensor held_grad = torch::zeros(held.sizes(), held.options().dtype(acc));  // [2, B, Hkv, 2m, D]
    Hop grad_hop;
    for (int step = 0; step < C; ++step) {
      const auto block_chunks = split.chunks_of((r - step + C) % C);
      Hop hop;
      if (step + 1 < C) hop = start_hop(cp, held, kBackwardKvTag);
      if (step > 0) {  // this block's gradients so far, from the ranks it visited before
        grad_hop.wait();
        held_grad = grad_hop.incoming;
      }
      for (int i = 0; i < 2; ++i) {
        auto rows = [&](const torch::Tensor& t) { return t.narrow(2, i * m, m); };
        for (const Span& span : spans_of(my_chunks[i], block_chunks, g.causal)) {
          const auto [dqi, dk, dv] = attend_chunk_backward(rows(dout), rows(q), span_of(held[0], span, m, group),
                                                           span_of(held[1], span, m, group), rows(output),
                                                           rows(lse_all), span.diagonal, g.scale);
          rows(dq).add_(dqi);
          held_grad[0].narrow(2, span.first * m, span.count * m).add_(summed_over_group(dk, group));
          held_grad[1].narrow(2, span.first * m, span.count * m).add_(summed_over_group(dv, group));
        }
      }
      // The held block's gradients go on with it; the last hop brings each block's home.
      if (C > 1) grad_hop = start_hop(cp, held_grad, kKvGradTag);
      if (step + 1 < C) {
        hop.wait();
        held = hop.incoming;
      }
    }
    if (C > 1) {
      grad_hop.wait();
      held_grad = grad_hop.incoming;
    }
    return {dq.to(q.scalar_type()),
            held_grad[0].to(k.scalar_type()),
            held_grad[1].to(v.scalar_type()),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ring_attention(const torch::Tensor& q,
                             const torch::Tensor& k,
                             const torch::Tensor& v,
                             Communicator& cp,
                             const SequenceSplit& split,
                             const AttentionOptions& options) {
  detail::check_attention_inputs("ring", q, k, v, cp, split);
  Geometry g;
  g.seq_len = split.seq_len();
  g.cp = split.cp();
  g.load_balance = split.load_balance();
  g.causal = options.causal;
  g.scale = detail::attention_scale(options, q.size(3));
  return RingAttention::apply(q, k, v, &cp, g, options.counters);
}

}  // namespace parallax::context_parallel
