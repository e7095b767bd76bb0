#include "parallax/runtime/trainer_optimizer.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <array>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

// The options of parameter group `group` of `optimizer`, in its own type.
template <typename Options>
const Options& group_options(const torch::optim::Optimizer& optimizer, std::size_t group) {
  return static_cast<const Options&>(optimizer.param_groups().at(group).options());
}

using O = OptimizerOptions;

// One [optimizer] key a type reads, and where its value lives.
struct OptimizerKey {
  const char* name;  // e.g. "lr"
  std::variant<double O::*, bool O::*, std::array<double, 2> O::*> member;
};

// The trainer's optimizer as [optimizer] values, and the keys its type reads.
struct TrainerValues {
  std::string name;  // e.g. "torch::optim::Adam"
  OptimizerOptions options;
  std::vector<OptimizerKey> keys;

  template <typename T>
  void take(const char* key, T O::*member, T value) {
    options.*member = value;
    keys.push_back({key, member});
  }
};

TrainerValues trainer_values(const torch::optim::Optimizer& optimizer, std::size_t group) {
  TrainerValues t;
  OptimizerOptions& o = t.options;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) {
    t.name = "torch::optim::SGD";
    const auto& s = group_options<torch::optim::SGDOptions>(optimizer, group);
    o.type = OptimizerType::kSgd;
    t.take("lr", &O::lr, s.lr());
    t.take("momentum", &O::momentum, s.momentum());
    t.take("dampening", &O::dampening, s.dampening());
    t.take("weight_decay", &O::weight_decay, s.weight_decay());
    t.take("nesterov", &O::nesterov, s.nesterov());
  } else if (dynamic_cast<const torch::optim::Adam*>(&optimizer) || dynamic_cast<const torch::optim::AdamW*>(&optimizer)) {
    const bool decoupled = dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr;
    t.name = decoupled ? "torch::optim::AdamW" : "torch::optim::Adam";
    const auto read = [&](const auto& a) {
      t.take("lr", &O::lr, a.lr());
      t.take("betas", &O::betas, std::array<double, 2>{std::get<0>(a.betas()), std::get<1>(a.betas())});
      t.take("eps", &O::eps, a.eps());
      t.take("weight_decay", &O::weight_decay, a.weight_decay());
      t.take("amsgrad", &O::amsgrad, a.amsgrad());
    };
    if (decoupled) {
      read(group_options<torch::optim::AdamWOptions>(optimizer, group));
    } else {
      read(group_options<torch::optim::AdamOptions>(optimizer, group));
    }
    o.type = decoupled ? OptimizerType::kAdamW : OptimizerType::kAdam;
  } else if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer)) {
    t.name = "torch::optim::RMSprop";
    const auto& r = group_options<torch::optim::RMSpropOptions>(optimizer, group);
    o.type = OptimizerType::kRmsprop;
    t.take("lr", &O::lr, r.lr());
    t.take("alpha", &O::alpha, r.alpha());
    t.take("eps", &O::eps, r.eps());
    t.take("weight_decay", &O::weight_decay, r.weight_decay());
    t.take("momentum", &O::momentum, r.momentum());
    t.take("centered", &O::centered, r.centered());
  } else if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer)) {
    t.name = "torch::optim::Adagrad";
    const auto& a = group_options<torch::optim::AdagradOptions>(optimizer, group);
    o.type = OptimizerType::kAdagrad;
    t.take("lr", &O::lr, a.lr());
    t.take("lr_decay", &O::lr_decay, a.lr_decay());
    t.take("weight_decay", &O::weight_decay, a.weight_decay());
    t.take("initial_accumulator_value", &O::initial_accumulator_value, a.initial_accumulator_value());
    t.take("eps", &O::eps, a.eps());
  } else {
    throw UsageError(
        "engine: the trainer's optimizer is none of torch::optim::SGD, Adam, AdamW, RMSprop, Adagrad, the ones "
        "Parallax can rebuild over its shards; pass parallax::OptimizerSpec::from(rt.config()) and set [optimizer] "
        "instead");
  }
  return t;
}

std::string show(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}
std::string show(bool value) {
  return value ? "true" : "false";
}
std::string show(const std::array<double, 2>& value) {
  return "[" + show(value[0]) + ", " + show(value[1]) + "]";
}

// One [optimizer] key: the config's value where it sets the key (listing a difference),
// else the trainer's.
template <typename T>
void merge(const std::string& key,
           T OptimizerOptions::*member,
           const Config& config,
           const TrainerValues& trainer,
           const std::string& group,
           OptimizerOptions& target,
           std::vector<std::string>& overrides) {
  const std::string where = config.position_of("optimizer." + key);
  T& value = target.*member;
  if (where.empty()) {
    value = trainer.options.*member;
  } else if (!(value == trainer.options.*member)) {
    overrides.push_back(detail::concat("optimizer.", key, " = ", show(value), where, " overrides the trainer's ",
                                       trainer.name, group, " ", key, " = ", show(trainer.options.*member)));
  }
}

bool same_options(const OptimizerOptions& a, const OptimizerOptions& b) {
  return a.type == b.type && a.lr == b.lr && a.betas == b.betas && a.eps == b.eps && a.weight_decay == b.weight_decay &&
         a.amsgrad == b.amsgrad && a.momentum == b.momentum && a.dampening == b.dampening && a.nesterov == b.nesterov &&
         a.alpha == b.alpha && a.centered == b.centered && a.lr_decay == b.lr_decay &&
         a.initial_accumulator_value == b.initial_accumulator_value;
}

}  // namespace

AdoptedOptimizer read_trainer_optimizer(const Config& config, const torch::optim::Optimizer& optimizer) {
  const std::size_t groups = optimizer.param_groups().size();
  AdoptedOptimizer out;
  out.spec = OptimizerSpec::from(config);
  PARALLAX_CHECK(groups > 0, UsageError, "engine: the trainer's optimizer has no parameter group");
  std::vector<OptimizerOptions> merged;
  for (std::size_t g = 0; g < groups; ++g) {
    const TrainerValues trainer = trainer_values(optimizer, g);
    const std::string type_where = config.position_of("optimizer.type");
    PARALLAX_CHECK(type_where.empty() || config.optimizer.type == trainer.options.type, ConfigError,
                   "optimizer.type = \"", to_string(config.optimizer.type), "\"", type_where,
                   ": the trainer passes its own ", trainer.name,
                   " to the engine; remove the key, or pass the optimizer it names");
    OptimizerOptions options = out.spec.optimizer;
    options.type = trainer.options.type;
    const std::string label = groups == 1 ? "" : detail::concat(" (parameter group ", g, ")");
    for (const OptimizerKey& key : trainer.keys) {
      std::visit([&](auto member) { merge(key.name, member, config, trainer, label, options, out.overrides); },
                 key.member);
    }
    merged.push_back(options);
  }
  out.spec.optimizer = merged.front();
  // Groups that differ step with their own options; groups alike are one.
  for (const OptimizerOptions& options : merged) {
    if (!same_options(options, merged.front())) {
      out.spec.parameter_groups = merged;
      break;
    }
  }
  bool scheduled = !config.position_of("optimizer.lr").empty();
  for (const char* key : {"scheduler.type", "scheduler.warmup_steps", "scheduler.min_lr"}) {
    scheduled = scheduled || !config.position_of(key).empty();
  }
  if (!scheduled) out.spec.lr_source = &optimizer;
  return out;
}

torch::Tensor release_trainer_optimizer(torch::optim::Optimizer& optimizer, const torch::nn::Module& model) {
  std::unordered_set<const void*> trainable;
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    trainable.insert(item.value().unsafeGetTensorImpl());
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::unordered_set<const void*> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      const void* impl = p.unsafeGetTensorImpl();
      PARALLAX_CHECK(held.insert(impl).second, UsageError,
                     "engine: the trainer's optimizer holds a parameter twice (shape ", p.sizes(), ")");
      PARALLAX_CHECK(trainable.count(impl) != 0, UsageError, "engine: the trainer's optimizer holds a tensor (shape ",
                     p.sizes(),
                     ") that is not a trainable parameter of the model; Parallax trains the model's parameters that "
                     "require grad");
    }
  }
  for (const auto& [impl, name] : names) {
    PARALLAX_CHECK(held.count(impl) != 0, UsageError, "engine: the model's parameter '", name,
                   "' requires grad but is not in the trainer's optimizer; Parallax trains every parameter that "
                   "requires grad: freeze it (requires_grad(false)) or add it to the optimizer");
  }
  for (const auto& entry : optimizer.state()) {
    const auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(entry.second.get());
    PARALLAX_CHECK(adagrad != nullptr && adagrad->step() == 0, UsageError,
                   "engine: the trainer's optimizer has already stepped; its state cannot move into Parallax's shards: "
                   "pass a fresh optimizer, and resume a run from a Parallax checkpoint (engine.resume())");
  }
  for (auto& group : optimizer.param_groups()) group.params().clear();
  optimizer.state().clear();
  // What the trainer's zero_grad() still reaches: one element the engine watches
  // (zero/gradient_ledger.h), with state made so the trainer's step() accepts it.
  torch::Tensor sentinel = torch::zeros({1});
  optimizer.param_groups().front().params().push_back(sentinel);
  optimizer_state(optimizer, sentinel, /*create=*/true);
  return sentinel;
}

std::map<std::string, std::size_t> trainer_parameter_groups(const torch::optim::Optimizer& optimizer,
                                                            const torch::nn::Module& model) {
  std::unordered_map<const void*, std::size_t> group_of;
  const auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) group_of.emplace(p.unsafeGetTensorImpl(), g);
  }
  std::map<std::string, std::size_t> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const auto found = group_of.find(item.value().unsafeGetTensorImpl());
    if (found != group_of.end()) out.emplace(item.key(), found->second);
  }
  return out;
}

OptimizerSpec adopt_trainer_optimizer(Runtime& runtime, const torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  AdoptedOptimizer adopted = read_trainer_optimizer(runtime.config(), optimizer);
  if (!adopted.spec.parameter_groups.empty()) adopted.spec.group_of = trainer_parameter_groups(optimizer, model);
  if (runtime.is_main()) {
    for (const std::string& line : adopted.overrides) runtime.logger().warn(line);
  }
  adopted.spec.zero_grad_sentinel = release_trainer_optimizer(optimizer, model);
  return adopted.spec;
}

}  // namespace parallax
