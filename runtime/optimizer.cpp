#include "parallax/runtime/optimizer.h"

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>

#include "parallax/core/communicator.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/offload/cpu_adam.h"

namespace parallax {
namespace {

std::int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? payload_bytes(t) : 0;
}

// LibTorch 1.13 keys the state by the TensorImpl's address as text, 2.x by the address.
template <typename Map = decltype(std::declval<torch::optim::Optimizer&>().state())>
auto state_key(const torch::Tensor& p) {
  using Key = typename std::decay_t<Map>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // what 1.13's c10::guts::to_string wrote (gone in 2.x)
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// The state of type State the optimizer keeps for `param`; with `create`, made by
// `init` (step count 0) when missing; null when missing and not created.
template <typename State, typename Init>
State* find_or_create(torch::optim::Optimizer& optimizer, const torch::Tensor& param, bool create, const Init& init) {
  auto& slot = optimizer.state()[state_key(param)];
  if (!slot) {
    if (!create) {
      optimizer.state().erase(state_key(param));
      return nullptr;
    }
    auto made = std::make_unique<State>();
    init(*made);
    slot = std::move(made);
  }
  return &static_cast<State&>(*slot);
}

// Adam's or AdamW's state for `param`: its named tensors, created when asked.
template <typename State, typename Options>
std::vector<std::pair<std::string, torch::Tensor>> adam_state(torch::optim::Optimizer& optimizer,
                                                              const torch::Tensor& param,
                                                              bool create) {
  const bool amsgrad = static_cast<const Options&>(optimizer.param_groups().front().options()).amsgrad();
  auto* state = find_or_create<State>(optimizer, param, create, [&](auto& made) {
    const auto zeros = [&] { return torch::zeros_like(param, torch::MemoryFormat::Contiguous); };
    made.step(0);
    made.exp_avg(zeros());
    made.exp_avg_sq(zeros());
    if (amsgrad) made.max_exp_avg_sq(zeros());
  });
  if (state == nullptr) return {};
  std::vector<std::pair<std::string, torch::Tensor>> out{{"exp_avg", state->exp_avg()},
                                                         {"exp_avg_sq", state->exp_avg_sq()}};
  if (amsgrad) out.emplace_back("max_exp_avg_sq", state->max_exp_avg_sq());
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> rmsprop_state(torch::optim::Optimizer& optimizer,
                                                                 const torch::Tensor& param,
                                                                 bool create) {
  const auto& o = static_cast<const torch::optim::RMSpropOptions&>(optimizer.param_groups().front().options());
  auto* state = find_or_create<torch::optim::RMSpropParamState>(optimizer, param, create, [&](auto& made) {
    const auto zeros = [&] { return torch::zeros_like(param, torch::MemoryFormat::Contiguous); };
    made.step(0);
    made.square_avg(zeros());
    if (o.momentum() > 0) made.momentum_buffer(zeros());
    if (o.centered()) made.grad_avg(zeros());
  });
  if (state == nullptr) return {};
  std::vector<std::pair<std::string, torch::Tensor>> out{{"square_avg", state->square_avg()}};
  if (o.momentum() > 0) out.emplace_back("momentum_buffer", state->momentum_buffer());
  if (o.centered()) out.emplace_back("grad_avg", state->grad_avg());
  return out;
}

// Adagrad makes every parameter's state when it is constructed.
std::vector<std::pair<std::string, torch::Tensor>> adagrad_state(torch::optim::Optimizer& optimizer,
                                                                 const torch::Tensor& param,
                                                                 bool create) {
  const auto& o = static_cast<const torch::optim::AdagradOptions&>(optimizer.param_groups().front().options());
  auto* state = find_or_create<torch::optim::AdagradParamState>(optimizer, param, create, [&](auto& made) {
    made.step(0);
    made.sum(torch::full_like(param, o.initial_accumulator_value(), torch::MemoryFormat::Contiguous));
  });
  if (state == nullptr) return {};
  return {{"sum", state->sum()}};
}

template <typename State>
void for_each_state(torch::optim::Optimizer& optimizer, const std::function<void(State&)>& visit) {
  for (auto& entry : optimizer.state()) {
    if (auto* state = dynamic_cast<State*>(entry.second.get())) visit(*state);
  }
}

// LibTorch's Adam or AdamW (Base; its options and per-parameter state), stepping each
// parameter with the fused CPU kernel. LibTorch's bias correction, state layout and
// lazy state creation are kept, so optimizer_state_bytes and set_learning_rate see a
// plain Adam/AdamW.
template <typename Base, typename Options, typename State>
class FusedCpuAdam final : public Base {
 public:
  FusedCpuAdam(std::vector<torch::Tensor> params, const Options& options, bool decoupled)
      : Base(std::move(params), options), decoupled_(decoupled) {}
  FusedCpuAdam(std::vector<torch::optim::OptimizerParamGroup> groups, const Options& defaults, bool decoupled)
      : Base(std::move(groups), defaults), decoupled_(decoupled) {}

  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    if (!eligible()) return Base::step(std::move(closure));
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure) {
      torch::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (torch::optim::OptimizerParamGroup& group : this->param_groups()) {
      const auto& o = static_cast<const Options&>(group.options());
      const offload::CpuAdam adam(offload::CpuAdamOptions(o.lr())
                                      .betas(std::get<0>(o.betas()), std::get<1>(o.betas()))
                                      .eps(o.eps())
                                      .weight_decay(o.weight_decay())
                                      .decoupled(decoupled_));
      for (torch::Tensor& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = this->state_[state_key(p)];
        if (!slot) {
          auto state = std::make_unique<State>();
          state->step(0);
          state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
          state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
          slot = std::move(state);
        }
        auto& state = static_cast<State&>(*slot);
        state.step(state.step() + 1);
        adam.step(p.data_ptr<float>(), p.grad().data_ptr<float>(), torch::Tensor(state.exp_avg()).data_ptr<float>(),
                  torch::Tensor(state.exp_avg_sq()).data_ptr<float>(), p.numel(), state.step());
        ++fused_steps_;
      }
    }
    return loss;
  }

  std::int64_t fused_steps() const { return fused_steps_; }

 private:
  bool eligible() const {
    for (const auto& group : this->param_groups()) {
      if (static_cast<const Options&>(group.options()).amsgrad()) return false;
      for (const auto& p : group.params()) {
        const torch::Tensor& g = p.grad();
        if (!p.is_cpu() || p.scalar_type() != torch::kFloat32 || !p.is_contiguous()) return false;
        if (g.defined() && (!g.is_cpu() || g.scalar_type() != torch::kFloat32 || !g.is_contiguous())) return false;
      }
    }
    return true;
  }

  bool decoupled_;
  std::int64_t fused_steps_ = 0;
};

using FusedAdam = FusedCpuAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>;
using FusedAdamW = FusedCpuAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

}  // namespace

OptimizerSpec OptimizerSpec::from(const Config& config) {
  OptimizerSpec spec;
  spec.optimizer = config.optimizer;
  spec.scheduler = config.scheduler;
  spec.total_steps = config.train.steps;
  return spec;
}

double scheduled_lr(const OptimizerSpec& spec, std::int64_t step) {
  PARALLAX_CHECK(step >= 0, UsageError, "scheduled_lr: step = ", step, ": expected >= 0");
  const double peak = spec.optimizer.lr;
  const std::int64_t warmup = spec.scheduler.warmup_steps;
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (spec.scheduler.type == SchedulerType::kConstant) return peak;
  const double decay_steps = static_cast<double>(std::max<std::int64_t>(1, spec.total_steps - warmup));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / decay_steps);
  const double floor = spec.scheduler.min_lr;
  if (spec.scheduler.type == SchedulerType::kLinear) return peak - (peak - floor) * progress;
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
}

double learning_rate(const OptimizerSpec& spec, std::int64_t step) {
  if (spec.lr_source != nullptr) return spec.lr_source->param_groups().front().options().get_lr();
  return scheduled_lr(spec, step);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& o,
                                                        std::vector<torch::Tensor> params,
                                                        AdamKernel kernel) {
  const bool fused = kernel == AdamKernel::kFusedCpu;
  switch (o.type) {
    case OptimizerType::kSgd:
      return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(o.lr)
                                                                        .momentum(o.momentum)
                                                                        .dampening(o.dampening)
                                                                        .weight_decay(o.weight_decay)
                                                                        .nesterov(o.nesterov));
    case OptimizerType::kAdam: {
      const auto options = torch::optim::AdamOptions(o.lr)
                               .betas({o.betas[0], o.betas[1]})
                               .eps(o.eps)
                               .weight_decay(o.weight_decay)
                               .amsgrad(o.amsgrad);
      if (fused) return std::make_unique<FusedAdam>(std::move(params), options, /*decoupled=*/false);
      return std::make_unique<torch::optim::Adam>(std::move(params), options);
    }
    case OptimizerType::kAdamW: {
      const auto options = torch::optim::AdamWOptions(o.lr)
                               .betas({o.betas[0], o.betas[1]})
                               .eps(o.eps)
                               .weight_decay(o.weight_decay)
                               .amsgrad(o.amsgrad);
      if (fused) return std::make_unique<FusedAdamW>(std::move(params), options, /*decoupled=*/true);
      return std::make_unique<torch::optim::AdamW>(std::move(params), options);
    }
    case OptimizerType::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(std::move(params), torch::optim::RMSpropOptions(o.lr)
                                                                            .alpha(o.alpha)
                                                                            .eps(o.eps)
                                                                            .weight_decay(o.weight_decay)
                                                                            .momentum(o.momentum)
                                                                            .centered(o.centered));
    case OptimizerType::kAdagrad:
      return std::make_unique<torch::optim::Adagrad>(std::move(params),
                                                     torch::optim::AdagradOptions(o.lr)
                                                         .lr_decay(o.lr_decay)
                                                         .weight_decay(o.weight_decay)
                                                         .initial_accumulator_value(o.initial_accumulator_value)
                                                         .eps(o.eps));
  }
  throw InternalError("make_optimizer: unknown optimizer type");
}

namespace {

// Whether `module`'s parameter `key` is of a kind `kinds` (optimizer.no_decay) exempts.
bool exempt(const torch::nn::Module& module, const std::string& key, const torch::Tensor& p,
            const std::vector<std::string>& kinds) {
  const auto wants = [&](const char* kind) { return std::find(kinds.begin(), kinds.end(), kind) != kinds.end(); };
  const auto is = [&](auto* typed) { return typed != nullptr; };
  if (key == "bias") return wants("bias");
  const bool embedding = is(dynamic_cast<const torch::nn::EmbeddingImpl*>(&module)) ||
                         is(dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&module));
  if (embedding) return wants("embedding");
  const bool norm = is(dynamic_cast<const torch::nn::LayerNormImpl*>(&module)) ||
                    is(dynamic_cast<const torch::nn::GroupNormImpl*>(&module)) ||
                    is(dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module)) ||
                    is(dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module)) ||
                    is(dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module)) ||
                    is(dynamic_cast<const torch::nn::InstanceNorm1dImpl*>(&module)) ||
                    is(dynamic_cast<const torch::nn::InstanceNorm2dImpl*>(&module)) ||
                    is(dynamic_cast<const torch::nn::InstanceNorm3dImpl*>(&module)) || p.dim() == 1;
  return norm && wants("norm");
}

}  // namespace

bool exempt_from_decay(const torch::nn::Module& model,
                       const torch::Tensor& param,
                       const std::vector<std::string>& kinds) {
  const auto held = [&](const torch::nn::Module& module, bool* result) {
    for (const auto& item : module.named_parameters(/*recurse=*/false)) {
      if (item.value().unsafeGetTensorImpl() != param.unsafeGetTensorImpl()) continue;
      *result = exempt(module, item.key(), item.value(), kinds);
      return true;
    }
    return false;
  };
  bool result = false;
  if (held(model, &result)) return result;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (held(*item.value(), &result)) return result;
  }
  return false;
}

void exempt_from_weight_decay(OptimizerSpec& spec,
                              const torch::nn::Module& model,
                              const std::function<std::string(const std::string&)>& name_of,
                              const std::function<std::optional<bool>(const torch::Tensor&)>& decided) {
  const std::vector<std::string>& kinds = spec.optimizer.no_decay;
  if (kinds.empty()) return;
  PARALLAX_CHECK(spec.parameter_groups.empty(), ConfigError, "optimizer.no_decay makes a parameter group of "
                 "weight_decay 0, and the trainer's optimizer has ", spec.parameter_groups.size(),
                 " parameter groups of their own options: give the groups in one place (remove optimizer.no_decay, "
                 "or pass an optimizer of one group)");
  OptimizerOptions no_decay = spec.optimizer;
  no_decay.weight_decay = 0.0;
  spec.parameter_groups = {spec.optimizer, no_decay};
  spec.group_of.clear();
  const auto add = [&](const torch::nn::Module& module, const std::string& prefix) {
    for (const auto& item : module.named_parameters(/*recurse=*/false)) {
      const std::string name = prefix.empty() ? item.key() : prefix + "." + item.key();
      const std::optional<bool> given = decided ? decided(item.value()) : std::nullopt;
      const bool exempted = given ? *given : exempt(module, item.key(), item.value(), kinds);
      spec.group_of[name_of ? name_of(name) : name] = exempted ? 1 : 0;
    }
  };
  add(model, "");
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) add(*item.value(), item.key());
}

OptimizerGroups optimizer_groups(const OptimizerSpec& spec, const std::vector<std::string>& names) {
  OptimizerGroups groups;
  if (spec.parameter_groups.empty()) {
    groups.options = {spec.optimizer};
    groups.of.assign(names.size(), 0);
    return groups;
  }
  groups.options = spec.parameter_groups;
  groups.options.front() = spec.optimizer;
  for (const std::string& name : names) {
    const auto found = spec.group_of.find(name);
    PARALLAX_CHECK(found != spec.group_of.end() && found->second < groups.options.size(), UsageError,
                   "engine: the trained parameter '", name, "' is in none of the optimizer's ",
                   groups.options.size(), " parameter groups");
    groups.of.push_back(found->second);
  }
  return groups;
}

std::vector<double> OptimizerGroups::lr_ratios() const {
  std::vector<double> ratios;
  for (const OptimizerOptions& o : options) ratios.push_back(options.front().lr == 0 ? 1.0 : o.lr / options.front().lr);
  return ratios;
}

namespace {

// The groups that hold any tensor, in order: the optimizer's parameter groups.
std::vector<std::size_t> held_groups(const OptimizerGroups& groups) {
  std::vector<bool> held(groups.options.size(), false);
  for (std::size_t k : groups.of) held.at(k) = true;
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < held.size(); ++k) {
    if (held[k]) out.push_back(k);
  }
  return out;
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerGroups& groups,
                                                        std::vector<torch::Tensor> params,
                                                        AdamKernel kernel) {
  PARALLAX_CHECK(!groups.options.empty() && groups.of.size() == params.size(), UsageError, "make_optimizer: ",
                 groups.options.size(), " group(s) assigned to ", groups.of.size(), " of ", params.size(), " tensors");
  if (groups.options.size() == 1) return make_optimizer(groups.options.front(), std::move(params), kernel);
  // Each group's tensors, then LibTorch's optimizer of the first group's type built
  // with one parameter group each (their options made as the one-group path makes them).
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (std::size_t k : held_groups(groups)) {
    PARALLAX_CHECK(groups.options[k].type == groups.options.front().type, UsageError,
                   "make_optimizer: parameter group ", k, " is ", to_string(groups.options[k].type), ", group 0 ",
                   to_string(groups.options.front().type));
    std::vector<torch::Tensor> tensors;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (groups.of[i] == k) tensors.push_back(params[i]);
    }
    // One tensor's optimizer gives the group's options in LibTorch's type.
    const auto single = make_optimizer(groups.options[k], {torch::zeros({1})}, AdamKernel::kLibTorch);
    param_groups.emplace_back(std::move(tensors), single->param_groups().front().options().clone());
  }
  const OptimizerOptions& o = groups.options.front();
  const bool fused = kernel == AdamKernel::kFusedCpu;
  switch (o.type) {
    case OptimizerType::kSgd:
      return std::make_unique<torch::optim::SGD>(std::move(param_groups), torch::optim::SGDOptions(o.lr));
    case OptimizerType::kAdam:
      if (fused) return std::make_unique<FusedAdam>(std::move(param_groups), torch::optim::AdamOptions(o.lr), false);
      return std::make_unique<torch::optim::Adam>(std::move(param_groups), torch::optim::AdamOptions(o.lr));
    case OptimizerType::kAdamW:
      if (fused) return std::make_unique<FusedAdamW>(std::move(param_groups), torch::optim::AdamWOptions(o.lr), true);
      return std::make_unique<torch::optim::AdamW>(std::move(param_groups), torch::optim::AdamWOptions(o.lr));
    case OptimizerType::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(std::move(param_groups), torch::optim::RMSpropOptions(o.lr));
    case OptimizerType::kAdagrad:
      return std::make_unique<torch::optim::Adagrad>(std::move(param_groups), torch::optim::AdagradOptions(o.lr));
  }
  throw InternalError("make_optimizer: unknown optimizer type");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr, const OptimizerGroups& groups) {
  if (groups.options.size() == 1) return set_learning_rate(optimizer, lr);
  const std::vector<double> ratios = groups.lr_ratios();
  const std::vector<std::size_t> held = held_groups(groups);
  auto& param_groups = optimizer.param_groups();
  PARALLAX_CHECK(param_groups.size() == held.size(), InternalError, "set_learning_rate: ", param_groups.size(),
                 " parameter groups, ", held.size(), " expected");
  for (std::size_t j = 0; j < held.size(); ++j) param_groups[j].options().set_lr(lr * ratios[held[j]]);
}

std::int64_t fused_parameter_steps(const torch::optim::Optimizer& optimizer) {
  if (const auto* adam = dynamic_cast<const FusedAdam*>(&optimizer)) return adam->fused_steps();
  if (const auto* adamw = dynamic_cast<const FusedAdamW*>(&optimizer)) return adamw->fused_steps();
  return 0;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t total = 0;
  for (const auto& entry : optimizer.state()) {
    const torch::optim::OptimizerParamState* state = entry.second.get();
    if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      total += bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) + bytes_of(adam->max_exp_avg_sq());
    } else if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      total += bytes_of(adamw->exp_avg()) + bytes_of(adamw->exp_avg_sq()) + bytes_of(adamw->max_exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      total += bytes_of(sgd->momentum_buffer());
    } else if (auto* rmsprop = dynamic_cast<const torch::optim::RMSpropParamState*>(state)) {
      total += bytes_of(rmsprop->square_avg()) + bytes_of(rmsprop->momentum_buffer()) + bytes_of(rmsprop->grad_avg());
    } else if (auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(state)) {
      total += bytes_of(adagrad->sum());
    }
  }
  return total;
}

std::vector<std::pair<std::string, torch::Tensor>> optimizer_state(torch::optim::Optimizer& optimizer,
                                                                   const torch::Tensor& param,
                                                                   bool create) {
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    return adam_state<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(optimizer, param, create);
  }
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) {
    return adam_state<torch::optim::AdamParamState, torch::optim::AdamOptions>(optimizer, param, create);
  }
  if (dynamic_cast<torch::optim::RMSprop*>(&optimizer)) return rmsprop_state(optimizer, param, create);
  if (dynamic_cast<torch::optim::Adagrad*>(&optimizer)) return adagrad_state(optimizer, param, create);
  auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer);
  PARALLAX_CHECK(sgd != nullptr, InternalError, "optimizer_state: not an optimizer make_optimizer builds");
  if (static_cast<const torch::optim::SGDOptions&>(sgd->param_groups().front().options()).momentum() == 0) return {};
  auto* state = find_or_create<torch::optim::SGDParamState>(optimizer, param, create, [&](auto& made) {
    made.momentum_buffer(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
  });
  if (state == nullptr) return {};
  return {{"momentum_buffer", state->momentum_buffer()}};
}

std::int64_t optimizer_steps(const torch::optim::Optimizer& optimizer) {
  std::int64_t steps = 0;
  auto& mutable_optimizer = const_cast<torch::optim::Optimizer&>(optimizer);  // read only
  for_each_state<torch::optim::AdamParamState>(mutable_optimizer, [&](auto& s) { steps = std::max(steps, s.step()); });
  for_each_state<torch::optim::AdamWParamState>(mutable_optimizer, [&](auto& s) { steps = std::max(steps, s.step()); });
  for_each_state<torch::optim::RMSpropParamState>(mutable_optimizer,
                                                  [&](auto& s) { steps = std::max(steps, s.step()); });
  for_each_state<torch::optim::AdagradParamState>(mutable_optimizer,
                                                  [&](auto& s) { steps = std::max(steps, s.step()); });
  return steps;
}

void set_optimizer_steps(torch::optim::Optimizer& optimizer, std::int64_t steps) {
  for_each_state<torch::optim::AdamParamState>(optimizer, [&](auto& s) { s.step(steps); });
  for_each_state<torch::optim::AdamWParamState>(optimizer, [&](auto& s) { s.step(steps); });
  for_each_state<torch::optim::RMSpropParamState>(optimizer, [&](auto& s) { s.step(steps); });
  for_each_state<torch::optim::AdagradParamState>(optimizer, [&](auto& s) { s.step(steps); });
}

void create_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params) {
  if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) return;
  for (const torch::Tensor& param : params) optimizer_state(optimizer, param, /*create=*/true);
}

namespace {

// `param`'s state as State, or null (none, or another optimizer's).
template <typename State>
State* state_of(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  auto found = optimizer.state().find(state_key(param));
  return found == optimizer.state().end() ? nullptr : dynamic_cast<State*>(found->second.get());
}

// Calls visit(state) with `param`'s step-counting state, if it has one.
template <typename Visit>
void visit_counted_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param, const Visit& visit) {
  if (auto* s = state_of<torch::optim::AdamParamState>(optimizer, param)) return visit(*s);
  if (auto* s = state_of<torch::optim::AdamWParamState>(optimizer, param)) return visit(*s);
  if (auto* s = state_of<torch::optim::RMSpropParamState>(optimizer, param)) return visit(*s);
  if (auto* s = state_of<torch::optim::AdagradParamState>(optimizer, param)) return visit(*s);
}

}  // namespace

std::int64_t parameter_steps(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  std::int64_t steps = 0;
  visit_counted_state(optimizer, param, [&](auto& state) { steps = state.step(); });
  return steps;
}

void set_parameter_steps(torch::optim::Optimizer& optimizer, const torch::Tensor& param, std::int64_t steps) {
  visit_counted_state(optimizer, param, [&](auto& state) { state.step(steps); });
}

}  // namespace parallax
