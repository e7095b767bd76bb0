#include "parallax/runtime/strategy_steps.h"

#include <unordered_set>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/expert_parallel/moe_layer.h"
#include "parallax/runtime/gradient_reduction.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"
#include "parallax/tensor_parallel/parallelize.h"
#include "parallax/zero/deferred_construction.h"
#include "proto/plan.pb.h"

namespace parallax {
namespace {

// Before the first collective that depends on the model: every rank must hold the same
// parameters and buffers (count, shapes, dtypes), or the broadcasts would mismatch.
void check_same_structure(Communicator& comm,
                          const std::vector<torch::Tensor>& params,
                          const std::vector<torch::Tensor>& buffers) {
  std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a over (dtype, shape) of each tensor
  auto mix = [&hash](std::int64_t value) {
    hash ^= static_cast<std::uint64_t>(value);
    hash *= 1099511628211ULL;
  };
  for (const auto* list : {&params, &buffers}) {
    mix(static_cast<std::int64_t>(list->size()));
    for (const auto& t : *list) {
      mix(static_cast<std::int64_t>(t.scalar_type()));
      for (auto size : t.sizes()) mix(size);
    }
  }
  const std::vector<int> differing = ranks_differing_from_root(comm, hash);
  PARALLAX_CHECK(differing.empty(), UsageError, "the model differs across ranks of group '", comm.name(), "': rank(s) ",
                 format_rank_set(differing), " hold other parameter or buffer shapes than rank 0 (", params.size(),
                 " parameters, ", buffers.size(), " buffers here); build the model from the same config on every rank");
}

// Rank 0 of `comm`'s parameters and buffers, on every rank of it (exact, in place).
void broadcast_from_first(Communicator& comm,
                          const std::vector<torch::Tensor>& params,
                          const std::vector<torch::Tensor>& buffers) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> aliases;
  for (const auto& t : params) aliases.push_back(t.detach());
  for (const auto& t : buffers) {
    // MPI has no bool type: a bool buffer (a mask) travels as its bytes.
    aliases.push_back(t.scalar_type() == torch::kBool ? t.detach().view(torch::kUInt8) : t.detach());
  }
  std::vector<WorkPtr> pending;
  for (auto& t : aliases) {
    PARALLAX_CHECK(t.is_contiguous(), UsageError, "model tensors must be contiguous to broadcast");
    pending.push_back(comm.broadcast(t, 0));
  }
  for (auto& w : pending) w->wait();
}

// Rank 0 of the tensor-parallel group says how the model was split.
void describe_split(Runtime& runtime, const proto::Plan& plan, const tensor_parallel::ParallelizedModel& split) {
  runtime.logger().summary("# tensor parallel: tp = ", plan.degrees().tp(), ", sequence parallel ",
                           tensor_parallel_options(plan).sequence_parallel ? "on" : "off");
  for (const std::string& line : split.describe()) runtime.logger().summary("#   ", line);
}

// A pipeline stage's layers split by the plan. The stages agree on the outcome (one
// stage's ConfigError fails every stage, so none waits in a later collective), and each
// rule must match a module on some stage.
// Splits `model` by the plan on every rank of `world` together: a plan that does not fit
// fails on every rank with its own message. Without the agreement a rank that finished its
// broadcasts first would exit on the error while another still waited in one, and that one
// would report only the first rank's failure (or be killed by the launcher before it spoke).
std::unique_ptr<tensor_parallel::ParallelizedModel> split_everywhere(Communicator& world,
                                                                     torch::nn::Module& model,
                                                                     const TensorParallelOptions& options,
                                                                     Communicator& tp,
                                                                     const tensor_parallel::ParallelizeOptions& how) {
  std::unique_ptr<tensor_parallel::ParallelizedModel> split;
  try {
    run_everywhere(world, "[tensor_parallel.plan]",
                   [&] { split = std::make_unique<tensor_parallel::ParallelizedModel>(model, options, tp, how); });
  } catch (const UsageError& e) {
    throw ConfigError(e.detail());  // the plan failed on another rank (another stage's part)
  }
  return split;
}

std::unique_ptr<tensor_parallel::ParallelizedModel> split_pipeline_stage(
    torch::nn::Module& stage,
    const TensorParallelOptions& options,
    Communicator& world,
    Communicator& tp,
    Communicator& pp,
    const std::function<std::string(const std::string&)>& plan_path) {
  std::unique_ptr<tensor_parallel::ParallelizedModel> split =
      split_everywhere(world, stage, options, tp, tensor_parallel::ParallelizeOptions{plan_path, true});
  // Per rule: the stages it matched on.
  const std::vector<bool> matched = split->rules_matched();
  torch::Tensor counts = torch::zeros({static_cast<std::int64_t>(matched.size())}, torch::kLong);
  for (std::size_t i = 0; i < matched.size(); ++i) counts[static_cast<std::int64_t>(i)] = matched[i] ? 1 : 0;
  pp.all_reduce(counts, {ReduceOp::kSum})->wait();
  const auto* count = counts.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < options.plan.size(); ++i) {
    const TpPlanRule& rule = options.plan[i];
    PARALLAX_CHECK(count[i] > 0, ConfigError, "[tensor_parallel.plan] \"", rule.pattern, "\"", rule.position,
                   " matches no Linear or Embedding on any of the ", pp.size(), " pipeline stages");
  }
  return split;
}

class TensorParallelStep final : public StrategyStep {
 public:
  void prepare(Preparation& p) override {
    // A plan slices the dense model each rank holds: make them the same one first.
    Communicator& tp = p.runtime.mesh().tp();
    const TensorParallelOptions options = tensor_parallel_options(p.plan);
    if (!options.plan.empty()) {
      // A plan slices whole weights: a model built under DeferredConstruction is
      // materialized first (each rank then holds the dense model once, briefly).
      for (const auto& param : p.unique) {
        if (zero::is_deferred(param)) zero::materialize(param);
      }
      check_same_structure(tp, p.unique, p.model.buffers());
      broadcast_from_first(tp, p.unique, p.model.buffers());
    }
    Communicator& world = p.runtime.mesh().world();
    if (p.stage == nullptr) {
      split_ = split_everywhere(world, p.model, options, tp, {});
    } else {
      split_ = split_pipeline_stage(p.model, options, world, tp, p.runtime.mesh().pp(), p.stage->plan_path);
    }
    describe_split(p.runtime, p.plan, *split_);
    tp_ = &tp;
  }

  void describe(const std::vector<torch::Tensor>& trained, ModelSplit& split) const override {
    split.norm_groups.push_back(tp_);
    for (std::size_t i = 0; i < trained.size(); ++i)
      split.norm_weights[i] /= static_cast<double>(split_->copies(trained[i]));
    split.tp = tp_;
    std::unordered_set<const void*> partial;
    for (const auto& param : split_->partial_gradient_parameters()) partial.insert(param.unsafeGetTensorImpl());
    for (std::size_t i = 0; i < trained.size(); ++i) {
      if (partial.count(trained[i].unsafeGetTensorImpl())) split.partial.push_back(i);
    }
  }

  std::shared_ptr<void> forward_scope() const override {
    return std::make_shared<tensor_parallel::ParallelizedModel::Scope>(split_->scope());
  }

  const tensor_parallel::ParallelizedModel* tensor_split() const override { return split_.get(); }

 private:
  std::unique_ptr<tensor_parallel::ParallelizedModel> split_;
  Communicator* tp_ = nullptr;
};

class PipelineStageStep final : public StrategyStep {
 public:
  void prepare(Preparation& p) override {
    pp_ = &p.runtime.mesh().pp();
    for (const auto& t : p.stage->norm_excluded) excluded_.insert(t.unsafeGetTensorImpl());
  }

  void describe(const std::vector<torch::Tensor>& trained, ModelSplit& split) const override {
    split.partial_backwards = true;  // a pipeline backward covers one chunk
    split.norm_groups.push_back(pp_);
    for (std::size_t i = 0; i < trained.size(); ++i) {
      if (excluded_.count(trained[i].unsafeGetTensorImpl())) split.norm_weights[i] = 0.0;
    }
  }

 private:
  Communicator* pp_ = nullptr;
  std::unordered_set<const void*> excluded_;  ///< tied copies another stage counts
};

class ContextParallelStep final : public StrategyStep {
 public:
  void prepare(Preparation& p) override {
    const ContextParallelOptions options = recorded_strategy(p.plan).context_parallel;
    context_parallel::AttentionOptions attention;
    attention.method = options.method == ContextMethod::kAllToAll ? context_parallel::AttentionMethod::kAllToAll
                                                                  : context_parallel::AttentionMethod::kRing;
    context_ = std::make_shared<context_parallel::ContextParallel>(p.runtime.mesh().cp(), attention,
                                                                   options.load_balance, options.sequence_dim);
    p.runtime.logger().summary("# context parallel: cp = ", context_->size(), ", ", to_string(options.method),
                               " attention, ", options.load_balance ? "load-balanced" : "contiguous",
                               " split of the batch's dimension ", options.sequence_dim);
  }

  std::shared_ptr<void> forward_scope() const override {
    return std::make_shared<context_parallel::ContextParallel::Scope>(*context_);
  }
  std::shared_ptr<context_parallel::ContextParallel> context() const override { return context_; }
  torch::Tensor local_part(const torch::Tensor& batch) const override { return context_->local_part(batch); }

 private:
  std::shared_ptr<context_parallel::ContextParallel> context_;
};

class DataParallelStep final : public StrategyStep {
 public:
  void prepare(Preparation& p) override {
    Communicator& replicas = p.runtime.mesh().replicas();
    check_same_structure(replicas, p.unique, p.model.buffers());
    // Parameters built under zero::DeferredConstruction hold no data yet. Stage 3 gives
    // each its data unit by unit while sharding; the other stages hold every parameter
    // anyway. Either way they are identical on every rank (same seed), so not broadcast.
    const int zero_stage = zero_options(p.plan).stage;
    std::unordered_set<const void*> deferred;
    for (const auto& param : p.unique) {
      if (zero::is_deferred(param)) deferred.insert(param.unsafeGetTensorImpl());
    }
    if (!deferred.empty()) {
      PARALLAX_CHECK(zero_stage == 3 ? p.dtype == torch::kFloat32 : true, ConfigError,
                     "a model built under DeferredConstruction trains in fp32 at zero.stage = 3 in this build "
                     "(precision.dtype = bf16/fp16 would materialize it whole); build it eagerly or use fp32");
      if (zero_stage < 3) {
        for (const auto& param : p.unique) zero::materialize(param);
        deferred.clear();
      }
    }
    // Every replica starts from replica 0's parameters and buffers (fp32, exact).
    std::vector<torch::Tensor> present;
    for (const auto& t : p.unique) {
      if (!deferred.count(t.unsafeGetTensorImpl())) present.push_back(t);
    }
    broadcast_from_first(replicas, present, p.model.buffers());
  }
};

class ExpertParallelStep final : public StrategyStep {
 public:
  void prepare(Preparation& p) override {
    layers_ = expert_parallel::moe_layers(p.model);
    Mesh& mesh = p.runtime.mesh();
    const int ep = mesh.degrees().ep;
    if (mesh.degrees().cp > 1) {
      for (const auto* layer : layers_) {
        PARALLAX_CHECK(layer->options().capacity_factor() == 0, ConfigError, "parallel.cp = ", mesh.degrees().cp,
                       " with a capacity-routed MoE layer (capacity_factor = ", layer->options().capacity_factor(),
                       "): the capacity rule counts whole sequences, which context parallelism splits; route "
                       "dropless (capacity_factor = 0) or set parallel.cp = 1");
      }
    }
    if (ep == 1) {
      // Every expert local; the load-balancing loss still counts the whole batch's choices.
      for (auto* layer : layers_) layer->set_token_group(&mesh.replicas());
      return;
    }
    PARALLAX_CHECK(!layers_.empty() || p.stage != nullptr, ConfigError, "parallel.ep = ", ep,
                   " but the model has no expert_parallel::MoeLayer to spread over ranks; set parallel.ep = 1");
    // Data parallelism (the step before) gave every rank replica 0's experts; each keeps its block.
    for (auto* layer : layers_) layer->distribute(mesh.expert(), &mesh.replicas());
    experts_ = &mesh.expert();
    expert_replicas_ = &mesh.expert_replicas();
    if (!layers_.empty()) {
      // What this rank holds: its experts' elements, and the dense ones.
      std::int64_t expert_elements = 0;
      for (const auto* layer : layers_) {
        for (const auto& param : layer->expert_parameters()) expert_elements += param.numel();
      }
      std::int64_t all_elements = 0;
      std::unordered_set<const void*> seen;
      for (const auto& param : p.model.parameters()) {
        if (seen.insert(param.unsafeGetTensorImpl()).second) all_elements += param.numel();
      }
      p.runtime.logger().summary("# expert parallel: ep = ", ep, ", ", layers_.size(), " MoE layer(s) of ",
                                 layers_.front()->options().n_experts(), " experts, ", layers_.front()->local_experts(),
                                 " per rank; per rank ", expert_elements, " expert parameters (its ep group holds ",
                                 expert_elements * ep, ") and ", all_elements - expert_elements,
                                 " dense; expert gradients reduced over ", expert_replicas_->size(), " rank(s) ('",
                                 expert_replicas_->name(), "')");
    }
  }

  void describe(const std::vector<torch::Tensor>& trained, ModelSplit& split) const override {
    if (experts_ == nullptr) return;
    std::unordered_set<const void*> expert;
    for (const auto* layer : layers_) {
      for (const auto& param : layer->expert_parameters()) expert.insert(param.unsafeGetTensorImpl());
    }
    for (std::size_t i = 0; i < trained.size(); ++i) {
      if (expert.count(trained[i].unsafeGetTensorImpl())) split.expert.members.push_back(i);
    }
    split.expert.comm = expert_replicas_;
    split.experts = experts_;
  }

 private:
  std::vector<expert_parallel::MoeLayerImpl*> layers_;
  Communicator* experts_ = nullptr;          ///< the ep group; null while ep = 1
  Communicator* expert_replicas_ = nullptr;  ///< the ranks holding the same experts
};

bool always(const proto::Plan&, const StageCoupling*) {
  return true;
}
bool tensor_parallel_applies(const proto::Plan& plan, const StageCoupling*) {
  return plan.degrees().tp() > 1;
}
bool pipeline_stage_applies(const proto::Plan&, const StageCoupling* stage) {
  return stage != nullptr;
}
bool context_parallel_applies(const proto::Plan& plan, const StageCoupling*) {
  return plan.degrees().cp() > 1;
}

template <typename Step>
std::unique_ptr<StrategyStep> make() {
  return std::make_unique<Step>();
}

}  // namespace

const std::vector<StepDef>& strategy_steps() {
  static const std::vector<StepDef> kSteps = {
      {"tensor parallelism", tensor_parallel_applies, make<TensorParallelStep>},
      {"pipeline stage", pipeline_stage_applies, make<PipelineStageStep>},
      {"context parallelism", context_parallel_applies, make<ContextParallelStep>},
      {"data parallelism", always, make<DataParallelStep>},
      {"expert parallelism", always, make<ExpertParallelStep>},
  };
  return kSteps;
}

}  // namespace parallax
