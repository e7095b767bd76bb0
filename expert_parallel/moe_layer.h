// A mixture-of-experts MLP: a router (a linear gate, no bias) chooses top_k experts per
// token, each expert is an MLP (fc1, GELU, fc2), and the token's output is its chosen
// experts' outputs times their weights. Under expert parallelism (distribute()) each
// rank of the expert-parallel group keeps E/P of the experts and tokens travel to them
// and back by all-to-all (expert_dispatch.h); the result is the single-process layer's.
//
// The auxiliary losses (moe_options.h) join the backward by themselves: the output
// carries them, so `loss.backward()` includes aux_loss_coef · balance + z_loss_coef · z
// with the weight the engine gives the loss (its 1/grad_accum and fp16 loss scale,
// set_aux_loss_gradient_scale). Routing statistics accumulate until take_stats().
//
// Parameters are named by global expert index ("experts.5.fc1.weight"), on every ep
// degree: a checkpoint keyed by name holds each expert once whatever the layout.
//
//   MoeLayer moe(/*hidden=*/768, /*ffn_hidden=*/3072, MoeOptions(8, 2).capacity_factor(1.25));
//   moe->distribute(mesh_ep, &mesh_replicas);   // before the engine collects parameters
//   torch::Tensor y = moe(x);                   // x [batch, seq, hidden]
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/expert_parallel/moe_options.h"

namespace parallax::expert_parallel {

/// One expert: fc2(gelu(fc1(x))).
class ExpertMlpImpl : public torch::nn::Module {
 public:
  ExpertMlpImpl(std::int64_t hidden, std::int64_t ffn_hidden);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(ExpertMlp);

/// What the layer's forwards routed since the last take_stats(), on this rank.
struct RoutingStats {
  std::int64_t forwards = 0;
  /// Per global expert: the choices of this rank's tokens each kept.
  std::vector<std::int64_t> tokens_per_expert;
  std::int64_t choices = 0;  ///< tokens × top_k
  std::int64_t dropped = 0;  ///< of them, dropped by the capacity rule
  /// Bytes the forwards' all-to-alls sent to other ranks (rows and counts; backward
  /// sends the rows' bytes again).
  std::int64_t exchange_bytes = 0;
  double balance_loss = 0.0;  ///< summed over forwards (unweighted; 1 is uniform)
  double z_loss = 0.0;        ///< summed over forwards (unweighted)

  /// max over experts / mean over experts of tokens_per_expert (1 = balanced); 0 when empty.
  double imbalance() const;
  /// Adds `other` (same number of experts, or this one empty).
  RoutingStats& operator+=(const RoutingStats& other);
};

class MoeLayerImpl : public torch::nn::Module {
 public:
  /// Every expert, initialised as LibTorch initialises Linear layers (so one seed gives
  /// one model on any ep degree). Throws UsageError for bad options.
  MoeLayerImpl(std::int64_t hidden, std::int64_t ffn_hidden, MoeOptions options);

  /// Keeps this rank's experts, [r·E/P, (r+1)·E/P) for rank r of `ep`'s P, and drops the
  /// rest; `token_group` (may be null) is where the load-balancing loss counts choices
  /// (moe_options.h). Both must outlive the layer. Call once, before the parameters are
  /// handed to an engine. Throws UsageError when P does not divide n_experts or when
  /// called twice. Does not communicate.
  void distribute(Communicator& ep, Communicator* token_group);
  /// Only the load-balancing loss's token group (every expert stays local).
  void set_token_group(Communicator* token_group) { token_group_ = token_group; }

  /// x [batch, seq_len, hidden] → [batch, seq_len, hidden]. Collective over ep and the
  /// token group (in backward, over ep).
  torch::Tensor forward(const torch::Tensor& x);

  const MoeOptions& options() const { return options_; }
  /// Global index of this rank's first expert, and how many it holds.
  std::int64_t first_expert() const { return first_expert_; }
  std::int64_t local_experts() const { return static_cast<std::int64_t>(experts_.size()); }
  /// The expert-parallel group (null before distribute()).
  Communicator* expert_group() const { return ep_; }
  /// This rank's experts' parameters (what reduces over the expert-data-parallel group).
  std::vector<torch::Tensor> expert_parameters() const;
  /// The statistics since the last call, and resets them.
  RoutingStats take_stats();

  torch::nn::Linear gate{nullptr};  ///< [n_experts, hidden], no bias

 private:
  MoeOptions options_;
  std::int64_t hidden_ = 0;
  std::shared_ptr<torch::nn::Module> expert_modules_;  ///< registered as "experts"
  std::vector<ExpertMlp> experts_;                     ///< this rank's, in global order
  std::int64_t first_expert_ = 0;
  Communicator* ep_ = nullptr;
  Communicator* token_group_ = nullptr;
  RoutingStats stats_;
};
TORCH_MODULE(MoeLayer);

/// The weight the auxiliary losses' gradient enters backward with: the engine sets its
/// own loss weight (1/grad_accum × the fp16 loss scale) around each backward. Process-
/// wide (autograd may run backward on another thread); 1 by default.
void set_aux_loss_gradient_scale(double scale);
double aux_loss_gradient_scale();
/// Sets the scale for its lifetime, then restores the one before.
class AuxLossGradientScale {
 public:
  explicit AuxLossGradientScale(double scale) : previous_(aux_loss_gradient_scale()) {
    set_aux_loss_gradient_scale(scale);
  }
  ~AuxLossGradientScale() { set_aux_loss_gradient_scale(previous_); }
  AuxLossGradientScale(const AuxLossGradientScale&) = delete;
  AuxLossGradientScale& operator=(const AuxLossGradientScale&) = delete;

 private:
  double previous_;
};

/// Every MoeLayer in `model` (children first, in registration order).
std::vector<MoeLayerImpl*> moe_layers(torch::nn::Module& model);

}  // namespace parallax::expert_parallel
