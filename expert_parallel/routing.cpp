#include "parallax/expert_parallel/routing.h"

#include <ATen/ATen.h>

#include <cmath>

#include "parallax/core/error.h"

namespace parallax::expert_parallel {

const char* to_string(RouterScore score) {
  switch (score) {
    case RouterScore::kSoftmax:
      return "softmax";
    case RouterScore::kSigmoid:
      return "sigmoid";
  }
  return "?";
}

std::int64_t expert_capacity(const MoeOptions& options, std::int64_t seq_len) {
  if (options.capacity_factor() <= 0) return 0;
  return static_cast<std::int64_t>(
      std::ceil(options.capacity_factor() * static_cast<double>(options.top_k() * seq_len) /
                static_cast<double>(options.n_experts())));
}

namespace {

// The capacity rule (moe_options.h), per sequence: choices ordered first by choice rank,
// then by position, each taking the next slot of its expert while slots remain.
torch::Tensor kept_by_capacity(const torch::Tensor& expert,
                               const MoeOptions& options,
                               std::int64_t batch,
                               std::int64_t seq_len) {
  const std::int64_t k = options.top_k();
  const std::int64_t capacity = expert_capacity(options, seq_len);
  const torch::Tensor by_choice = expert.view({batch, seq_len, k}).permute({0, 2, 1}).reshape({batch, k * seq_len});
  const torch::Tensor slot =
      at::one_hot(by_choice, options.n_experts()).cumsum(1).gather(2, by_choice.unsqueeze(2)).squeeze(2) - 1;
  return (slot < capacity).view({batch, k, seq_len}).permute({0, 2, 1}).reshape({batch * seq_len, k});
}

}  // namespace

Routing route(const torch::Tensor& logits, const MoeOptions& options, Communicator* token_group) {
  const std::int64_t n_experts = options.n_experts();
  const std::int64_t k = options.top_k();
  PARALLAX_CHECK(n_experts >= 1 && k >= 1 && k <= n_experts, UsageError, "MoE routing: top_k = ", k,
                 " must be in 1..n_experts (", n_experts, ")");
  PARALLAX_CHECK(options.capacity_factor() >= 0 && options.aux_loss_coef() >= 0 && options.z_loss_coef() >= 0,
                 UsageError, "MoE routing: capacity_factor (", options.capacity_factor(), "), aux_loss_coef (",
                 options.aux_loss_coef(), ") and z_loss_coef (", options.z_loss_coef(), ") must be >= 0");
  PARALLAX_CHECK(logits.dim() == 3 && logits.size(2) == n_experts, UsageError,
                 "MoE routing: logits must be [batch, seq_len, n_experts = ", n_experts, "], got ", logits.sizes());
  const std::int64_t batch = logits.size(0);
  const std::int64_t seq_len = logits.size(1);
  const std::int64_t tokens = batch * seq_len;
  const auto score_dtype = logits.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const torch::Tensor z = logits.to(score_dtype).reshape({tokens, n_experts});

  torch::Tensor scores;       // what the top-k chooses by
  torch::Tensor probability;  // each token's distribution over the experts, for P_e
  if (options.score() == RouterScore::kSoftmax) {
    scores = torch::softmax(z, -1);
    probability = scores;
  } else {
    scores = torch::sigmoid(z);
    probability = scores / scores.sum(-1, /*keepdim=*/true);
  }
  auto [top, expert] = torch::topk(scores, k, -1);
  if (options.score() == RouterScore::kSigmoid || options.normalize_weights()) top = top / top.sum(-1, true);

  Routing r;
  r.expert = expert;
  r.weight = top.to(logits.scalar_type());
  r.kept = options.capacity_factor() > 0 ? kept_by_capacity(expert, options, batch, seq_len)
                                         : torch::ones({tokens, k}, torch::kBool);
  r.tokens_per_expert = torch::bincount(expert.masked_select(r.kept), {}, n_experts);
  r.choices = tokens * k;
  r.dropped = r.choices - r.tokens_per_expert.sum().item<std::int64_t>();

  // f_e over the whole token group: its choice counts (before the capacity rule) and
  // tokens, summed in one all-reduce.
  torch::Tensor counts =
      torch::cat({torch::bincount(expert.reshape({-1}), {}, n_experts), torch::full({1}, tokens, torch::kInt64)});
  if (token_group != nullptr && token_group->size() > 1) token_group->all_reduce(counts)->wait();
  const double group_choices = static_cast<double>(counts[n_experts].item<std::int64_t>() * k);
  const torch::Tensor fraction = counts.narrow(0, 0, n_experts).to(score_dtype) / group_choices;
  const torch::Tensor balance = static_cast<double>(n_experts) * (fraction * probability.mean(0)).sum();
  const torch::Tensor z_loss = torch::logsumexp(z, -1).pow(2).mean();
  r.balance_loss = balance.item<double>();
  r.z_loss = z_loss.item<double>();
  r.aux_loss = options.aux_loss_coef() * balance + options.z_loss_coef() * z_loss;
  return r;
}

}  // namespace parallax::expert_parallel
