// What a mixture-of-experts layer routes by: the options of expert_parallel::MoeLayer.
//
//   MoeOptions options(/*n_experts=*/8, /*top_k=*/2);
//   options.capacity_factor(1.25).aux_loss_coef(0.01).z_loss_coef(1e-3);
#pragma once

#include <torch/arg.h>

#include <cstdint>

namespace parallax::expert_parallel {

/// How the router turns its logits into scores.
enum class RouterScore {
  kSoftmax,  ///< softmax over the experts (Switch, GShard, Mixtral)
  kSigmoid,  ///< an independent sigmoid per expert, the chosen k normalised to sum 1 (DeepSeek-V3)
};
/// "softmax", "sigmoid".
const char* to_string(RouterScore score);

struct MoeOptions {
  MoeOptions(std::int64_t n_experts, std::int64_t top_k) : n_experts_(n_experts), top_k_(top_k) {}

  /// Experts in the layer, e.g. 64. Under expert parallelism the ep degree must divide it.
  TORCH_ARG(std::int64_t, n_experts);
  /// Experts each token goes to, 1 ≤ top_k ≤ n_experts, e.g. 2.
  TORCH_ARG(std::int64_t, top_k);
  /// The router's score function. Default: kSoftmax.
  TORCH_ARG(RouterScore, score) = RouterScore::kSoftmax;
  /// kSoftmax only: divide the k chosen probabilities by their sum (Mixtral) instead of
  /// using them as they are (Switch, GShard). kSigmoid always normalises. Default: false.
  TORCH_ARG(bool, normalize_weights) = false;
  /// 0: dropless, every token reaches its k experts. > 0: each expert takes at most
  /// ceil(capacity_factor · top_k · seq_len / n_experts) tokens of each sequence; the
  /// rule, per sequence: every token's first choice before any token's second choice,
  /// and within one choice earlier positions first; a choice past its expert's capacity
  /// is dropped (it adds nothing; the residual carries the token). Default: 0.
  TORCH_ARG(double, capacity_factor) = 0.0;
  /// Weight of the load-balancing loss, n_experts · Σ_e f_e · P_e (Switch, GShard): f_e
  /// the fraction of the forward's choices (over every data-parallel rank) that went to
  /// e, P_e the mean score of e. Its gradient joins every backward through the layer's
  /// output: the trainer does not add it. Default: 0.01.
  TORCH_ARG(double, aux_loss_coef) = 0.01;
  /// Weight of the router z-loss, the mean over tokens of logsumexp(logits)² (ST-MoE).
  /// Joins the backward as the auxiliary loss does. Default: 0.
  TORCH_ARG(double, z_loss_coef) = 0.0;
};

}  // namespace parallax::expert_parallel
