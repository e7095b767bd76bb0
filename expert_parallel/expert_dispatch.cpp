#include "parallax/expert_parallel/expert_dispatch.h"

#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "parallax/core/autograd_context.h"
#include "parallax/core/error.h"

namespace parallax::expert_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

torch::Tensor exchange(const torch::Tensor& rows,
                       Communicator& ep,
                       const std::vector<std::int64_t>& send,
                       const std::vector<std::int64_t>& recv) {
  const torch::Tensor input = rows.contiguous();
  std::vector<std::int64_t> shape = input.sizes().vec();
  shape[0] = std::accumulate(recv.begin(), recv.end(), std::int64_t{0});
  torch::Tensor output = torch::empty(shape, input.options());
  ep.all_to_all(output, recv, input, send)->wait();
  return output;
}

// The rows' exchange as an autograd function: backward sends each gradient row back to
// the rank its row came from.
struct ExchangeRows : torch::autograd::Function<ExchangeRows> {
  static torch::Tensor forward(AutogradContext* ctx,
                               const torch::Tensor& rows,
                               Communicator* ep,
                               std::vector<std::int64_t> send,
                               std::vector<std::int64_t> recv) {
    parallax::detail::remember(ctx, *ep);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange(rows, *ep, send, recv);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {exchange(grads[0], parallax::detail::recall(ctx), ctx->saved_data["recv"].toIntVector(),
                     ctx->saved_data["send"].toIntVector()),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ExpertDispatch::ExpertDispatch(const Routing& routing, std::int64_t n_experts, Communicator* ep)
    : ep_(ep != nullptr && ep->size() > 1 ? ep : nullptr),
      rank_(ep_ ? ep_->rank() : 0),
      ranks_(ep_ ? ep_->size() : 1),
      top_k_(routing.expert.size(1)) {
  PARALLAX_CHECK(n_experts % ranks_ == 0, UsageError, "expert parallelism: n_experts = ", n_experts,
                 " does not divide over the ", ranks_, " ranks of group '", ep->name(), "'");
  const std::int64_t local = n_experts / ranks_;

  // a. The kept choices, sorted by expert; token order stays within an expert.
  const torch::Tensor kept_choice = routing.kept.reshape({-1}).nonzero().reshape({-1});
  const torch::Tensor kept_expert = routing.expert.reshape({-1}).index_select(0, kept_choice);
  const torch::Tensor by_expert =
      std::get<1>(torch::sort(kept_expert, c10::optional<bool>(true), /*dim=*/0, /*descending=*/false));
  choice_ = kept_choice.index_select(0, by_expert);
  token_ = torch::div(choice_, top_k_, "floor");
  const torch::Tensor counts = routing.tokens_per_expert.to(torch::kInt64).contiguous();  // [E]

  // b. What every rank sends to this rank's experts: counts[source][local expert].
  torch::Tensor received = counts.view({ranks_, local});
  if (ep_)
    received = exchange(received, *ep_, std::vector<std::int64_t>(ranks_, 1), std::vector<std::int64_t>(ranks_, 1));
  const torch::Tensor sent_per_rank = counts.view({ranks_, local}).sum(1);
  const torch::Tensor recv_per_rank = received.sum(1);
  send_rows_.assign(sent_per_rank.data_ptr<std::int64_t>(), sent_per_rank.data_ptr<std::int64_t>() + ranks_);
  recv_rows_.assign(recv_per_rank.data_ptr<std::int64_t>(), recv_per_rank.data_ptr<std::int64_t>() + ranks_);
  const torch::Tensor per_expert = received.sum(0);
  rows_per_expert_.assign(per_expert.data_ptr<std::int64_t>(), per_expert.data_ptr<std::int64_t>() + local);

  // c. Received rows come by source, then expert: list each (expert, source) run's rows.
  // Without an exchange they are already by expert.
  if (!ep_) return;
  const std::int64_t* n = received.data_ptr<std::int64_t>();
  std::vector<std::int64_t> start(ranks_ * local + 1, 0);
  std::partial_sum(n, n + ranks_ * local, start.begin() + 1);
  std::vector<std::int64_t> order;
  order.reserve(start.back());
  for (std::int64_t e = 0; e < local; ++e) {
    for (std::int64_t s = 0; s < ranks_; ++s) {
      const std::int64_t run = s * local + e;
      for (std::int64_t i = start[run]; i < start[run + 1]; ++i) order.push_back(i);
    }
  }
  to_expert_order_ = torch::tensor(order, torch::kInt64);
  to_source_order_ = torch::empty_like(to_expert_order_);
  to_source_order_.index_put_({to_expert_order_}, torch::arange(to_expert_order_.numel(), torch::kInt64));
}

torch::Tensor ExpertDispatch::dispatch(const torch::Tensor& tokens) const {
  torch::Tensor rows = tokens.index_select(0, token_);
  if (!ep_) return rows;
  return ExchangeRows::apply(rows, ep_, send_rows_, recv_rows_).index_select(0, to_expert_order_);
}

torch::Tensor ExpertDispatch::combine(const torch::Tensor& expert_rows, const torch::Tensor& weight) const {
  torch::Tensor rows = expert_rows;
  if (ep_) rows = ExchangeRows::apply(rows.index_select(0, to_source_order_), ep_, recv_rows_, send_rows_);
  const torch::Tensor scaled = rows * weight.reshape({-1}).index_select(0, choice_).unsqueeze(1);
  const std::int64_t tokens = weight.size(0);
  return torch::zeros({tokens, rows.size(1)}, rows.options()).index_add(0, token_, scaled);
}

std::int64_t ExpertDispatch::exchange_bytes(std::int64_t row_bytes) const {
  std::int64_t rows = 0;
  for (int q = 0; q < ranks_; ++q) {
    if (q != rank_) rows += send_rows_[q] + recv_rows_[q];
  }
  return ep_ ? rows * row_bytes : 0;
}

std::int64_t ExpertDispatch::count_bytes() const {
  return ep_ ? static_cast<std::int64_t>(ranks_ - 1) * static_cast<std::int64_t>(rows_per_expert_.size()) * 8 : 0;
}

}  // namespace parallax::expert_parallel
