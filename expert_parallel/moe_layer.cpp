#include "parallax/expert_parallel/moe_layer.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/activation.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "parallax/core/error.h"
#include "parallax/expert_parallel/expert_dispatch.h"
#include "parallax/expert_parallel/routing.h"

namespace parallax::expert_parallel {
namespace {

std::atomic<double> aux_gradient_scale{1.0};

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Forward: the layer's output as it is. Backward: its gradient as it is, and the
// auxiliary loss's gradient, the engine's loss weight: so backward through the output
// adds the auxiliary loss to whatever loss the trainer differentiates.
struct CarryAuxLoss : torch::autograd::Function<CarryAuxLoss> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& output, const torch::Tensor& aux) {
    ctx->saved_data["aux_options"] = aux.options().dtype().toScalarType();
    return output.view_as(output);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto dtype = ctx->saved_data["aux_options"].toScalarType();
    return {grads[0], torch::full({}, aux_loss_gradient_scale(), torch::TensorOptions().dtype(dtype))};
  }
};

void collect(torch::nn::Module& module, std::vector<MoeLayerImpl*>& out) {
  for (const auto& child : module.children()) collect(*child, out);
  if (auto* layer = dynamic_cast<MoeLayerImpl*>(&module)) out.push_back(layer);
}

}  // namespace

void set_aux_loss_gradient_scale(double scale) {
  aux_gradient_scale.store(scale);
}
double aux_loss_gradient_scale() {
  return aux_gradient_scale.load();
}

ExpertMlpImpl::ExpertMlpImpl(std::int64_t hidden, std::int64_t ffn_hidden)
    : fc1(register_module("fc1", torch::nn::Linear(hidden, ffn_hidden))),
      fc2(register_module("fc2", torch::nn::Linear(ffn_hidden, hidden))) {}

torch::Tensor ExpertMlpImpl::forward(const torch::Tensor& x) {
  return fc2(torch::gelu(fc1(x)));
}

double RoutingStats::imbalance() const {
  if (tokens_per_expert.empty()) return 0.0;
  const std::int64_t most = *std::max_element(tokens_per_expert.begin(), tokens_per_expert.end());
  std::int64_t total = 0;
  for (std::int64_t n : tokens_per_expert) total += n;
  return total == 0
             ? 0.0
             : static_cast<double>(most) * static_cast<double>(tokens_per_expert.size()) / static_cast<double>(total);
}

RoutingStats& RoutingStats::operator+=(const RoutingStats& other) {
  if (tokens_per_expert.empty()) tokens_per_expert.assign(other.tokens_per_expert.size(), 0);
  PARALLAX_CHECK(other.tokens_per_expert.size() == tokens_per_expert.size(), UsageError, "RoutingStats: adding ",
                 other.tokens_per_expert.size(), " experts' counts to ", tokens_per_expert.size());
  for (std::size_t e = 0; e < tokens_per_expert.size(); ++e) tokens_per_expert[e] += other.tokens_per_expert[e];
  forwards += other.forwards;
  choices += other.choices;
  dropped += other.dropped;
  exchange_bytes += other.exchange_bytes;
  balance_loss += other.balance_loss;
  z_loss += other.z_loss;
  return *this;
}

MoeLayerImpl::MoeLayerImpl(std::int64_t hidden, std::int64_t ffn_hidden, MoeOptions options)
    : options_(options), hidden_(hidden) {
  PARALLAX_CHECK(options_.n_experts() >= 1 && options_.top_k() >= 1 && options_.top_k() <= options_.n_experts(),
                 UsageError, "MoeLayer: top_k = ", options_.top_k(), " must be in 1..n_experts (", options_.n_experts(),
                 ")");
  PARALLAX_CHECK(hidden >= 1 && ffn_hidden >= 1, UsageError, "MoeLayer: hidden (", hidden, ") and ffn_hidden (",
                 ffn_hidden, ") must be >= 1");
  gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(hidden, options_.n_experts()).bias(false)));
  expert_modules_ = register_module("experts", std::make_shared<torch::nn::Module>("Experts"));
  for (std::int64_t e = 0; e < options_.n_experts(); ++e) {
    experts_.push_back(expert_modules_->register_module(std::to_string(e), ExpertMlp(hidden, ffn_hidden)));
  }
  stats_.tokens_per_expert.assign(static_cast<std::size_t>(options_.n_experts()), 0);
}

void MoeLayerImpl::distribute(Communicator& ep, Communicator* token_group) {
  PARALLAX_CHECK(ep_ == nullptr, UsageError, "MoeLayer::distribute: the layer is already distributed over '",
                 ep_->name(), "'");
  PARALLAX_CHECK(options_.n_experts() % ep.size() == 0, UsageError,
                 "expert parallelism: n_experts = ", options_.n_experts(), " does not divide over the ", ep.size(),
                 " ranks of group '", ep.name(), "'; choose parallel.ep dividing it");
  const std::int64_t local = options_.n_experts() / ep.size();
  first_expert_ = local * ep.rank();
  std::vector<ExpertMlp> kept;
  for (std::int64_t e = 0; e < options_.n_experts(); ++e) {
    if (e >= first_expert_ && e < first_expert_ + local) {
      kept.push_back(experts_[static_cast<std::size_t>(e)]);
    } else {
      expert_modules_->unregister_module(std::to_string(e));
    }
  }
  experts_ = std::move(kept);
  ep_ = &ep;
  token_group_ = token_group;
}

std::vector<torch::Tensor> MoeLayerImpl::expert_parameters() const {
  return expert_modules_->parameters();
}

torch::Tensor MoeLayerImpl::forward(const torch::Tensor& x) {
  PARALLAX_CHECK(x.dim() == 3 && x.size(2) == hidden_, UsageError, "MoeLayer: input must be [batch, seq_len, ", hidden_,
                 "], got ", x.sizes());
  const Routing routing = route(gate(x), options_, token_group_);
  const ExpertDispatch dispatch(routing, options_.n_experts(), ep_);
  const torch::Tensor tokens = x.reshape({-1, hidden_});
  const torch::Tensor rows = dispatch.dispatch(tokens);
  std::vector<torch::Tensor> outputs;
  std::int64_t at = 0;
  for (std::size_t e = 0; e < experts_.size(); ++e) {
    const std::int64_t n = dispatch.rows_per_expert()[e];
    outputs.push_back(experts_[e]->forward(rows.narrow(0, at, n)));
    at += n;
  }
  const torch::Tensor combined =
      dispatch.combine(outputs.empty() ? rows : torch::cat(outputs), routing.weight).view(x.sizes());

  RoutingStats now;
  now.forwards = 1;
  const torch::Tensor counts = routing.tokens_per_expert.contiguous();
  now.tokens_per_expert.assign(counts.data_ptr<std::int64_t>(), counts.data_ptr<std::int64_t>() + counts.numel());
  now.choices = routing.choices;
  now.dropped = routing.dropped;
  now.exchange_bytes = dispatch.exchange_bytes(hidden_ * x.element_size()) + dispatch.count_bytes();
  now.balance_loss = routing.balance_loss;
  now.z_loss = routing.z_loss;
  stats_ += now;

  const bool carries = (options_.aux_loss_coef() > 0 || options_.z_loss_coef() > 0) && routing.aux_loss.requires_grad();
  return carries ? CarryAuxLoss::apply(combined, routing.aux_loss) : combined;
}

RoutingStats MoeLayerImpl::take_stats() {
  RoutingStats out = stats_;
  stats_ = RoutingStats();
  stats_.tokens_per_expert.assign(static_cast<std::size_t>(options_.n_experts()), 0);
  return out;
}

std::vector<MoeLayerImpl*> moe_layers(torch::nn::Module& model) {
  std::vector<MoeLayerImpl*> out;
  collect(model, out);
  return out;
}

}  // namespace parallax::expert_parallel
