// The router's decision for one forward: which experts each token goes to, with what
// weight, which choices the capacity rule drops, and the auxiliary losses. Pure apart
// from one small all-reduce of the per-expert counts over the token group (so the
// load-balancing loss is the one a single process computes for the whole batch).
//
//   Routing r = route(logits, options, &replicas);    // logits [batch, seq, n_experts]
//   r.expert[t][j], r.weight[t][j], r.kept[t][j]       // token t's j-th choice
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "parallax/core/communicator.h"
#include "parallax/expert_parallel/moe_options.h"

namespace parallax::expert_parallel {

struct Routing {
  torch::Tensor expert;  ///< [tokens, top_k] int64: each token's experts, best first
  torch::Tensor weight;  ///< [tokens, top_k]: their combine weights (differentiable in the logits)
  torch::Tensor kept;    ///< [tokens, top_k] bool: false where the capacity rule dropped the choice
  /// aux_loss_coef · balance + z_loss_coef · z (a differentiable scalar) as this rank
  /// contributes it: the mean over the token group's ranks is the whole batch's loss.
  torch::Tensor aux_loss;
  double balance_loss = 0.0;  ///< n_experts · Σ f_e·P_e on this rank (uniform routing: 1), unweighted
  double z_loss = 0.0;        ///< mean logsumexp² of this rank's tokens, unweighted
  /// [n_experts] int64: this rank's choices each expert keeps.
  torch::Tensor tokens_per_expert;
  std::int64_t choices = 0;  ///< tokens × top_k on this rank
  std::int64_t dropped = 0;  ///< of them, dropped by the capacity rule
};

/// Routes the tokens of `logits` ([batch, seq_len, n_experts], in any floating dtype;
/// scores and losses are computed in float32 or float64, whichever is wider). Top-k
/// ties go to the lower expert index (torch::topk's order). `token_group`: the ranks
/// whose tokens join one optimizer step (the data-parallel replicas); the choice
/// fractions f_e are counted over all of them (one all-reduce of n_experts + 1 int64),
/// null for this rank's tokens alone. Throws UsageError for a bad shape or option.
Routing route(const torch::Tensor& logits, const MoeOptions& options, Communicator* token_group);

/// The per-sequence capacity of each expert under `options` (0 when dropless).
std::int64_t expert_capacity(const MoeOptions& options, std::int64_t seq_len);

}  // namespace parallax::expert_parallel
