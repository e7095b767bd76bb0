#include "parallax/runtime/step_applier.h"

#include <torch/nn/functional/loss.h>
#include <torch/version.h>

#include <algorithm>
#include <unordered_set>

#include "parallax/checkpoint/async_saver.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/flight_recorder.h"
#include "parallax/core/mesh.h"
#include "parallax/core/world.h"
#include "parallax/expert_parallel/moe_layer.h"
#include "parallax/runtime/gradient_reduction.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"
#include "parallax/runtime/step_telemetry.h"
#include "parallax/runtime/strategy_steps.h"
#include "parallax/tensor_parallel/vocab_parallel.h"
#include "parallax/zero/deferred_construction.h"
#include "parallax/zero/loss_scaler.h"

namespace parallax {
namespace {

// A stage's parameter "<module path>.<leaf>" under the whole model's module path.
std::string whole_model_name(const StageCoupling& stage, const std::string& name) {
  const std::size_t dot = name.rfind('.');
  const std::string module = stage.plan_path(dot == std::string::npos ? "" : name.substr(0, dot));
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  return module.empty() ? leaf : module + "." + leaf;
}

// A parameter belongs to one engine (one optimizer, one reduction, one ZeRO shard), and
// engines are told apart by name, also on disk (checkpoint.dir/<name>).
void check_beside_other_engines(Runtime& runtime, const std::string& name, const torch::nn::Module& model) {
  std::unordered_set<const void*> ours;
  for (const auto& p : model.parameters()) {
    if (p.requires_grad()) ours.insert(p.unsafeGetTensorImpl());
  }
  for (const StepApplier* other : runtime.engines()) {
    const std::string other_name = other->name().empty() ? "an unnamed engine" : "engine '" + other->name() + "'";
    PARALLAX_CHECK(name.empty() || other->name() != name, UsageError, "an engine named '", name,
                   "' exists already; give each engine its own name (EngineOptions)");
    PARALLAX_CHECK(!name.empty() || !other->name().empty() || runtime.config().checkpoint.dir.empty(), UsageError,
                   "a second unnamed engine would save its checkpoints into the same checkpoint.dir (\"",
                   runtime.config().checkpoint.dir,
                   "\") as the first: name them (EngineOptions(\"generator\"), ...), "
                   "and each saves under checkpoint.dir/<name>");
    const std::vector<std::string>& names = other->parameter_names();
    for (std::size_t i = 0; i < other->parameters().size(); ++i) {
      PARALLAX_CHECK(!ours.count(other->parameters()[i].unsafeGetTensorImpl()), UsageError, "parameter '", names[i],
                     "' of ", other_name,
                     " is in this engine's model too; a parameter belongs to one engine (one optimizer, one gradient "
                     "reduction): share the module through one engine, or give each engine a copy of its own");
    }
  }
}

torch::ScalarType compute_dtype_for(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32:
      return torch::kFloat32;
    case Dtype::kBf16:
      return torch::kBFloat16;
    case Dtype::kFp16:
      return torch::kFloat16;
  }
  throw InternalError("unknown precision.dtype");
}

zero::LossScalerOptions loss_scaler_options(const PrecisionOptions& precision) {
  return zero::LossScalerOptions(precision.loss_scale_initial)
      .growth_interval(precision.loss_scale_growth_interval)
      .backoff(precision.loss_scale_backoff)
      .hysteresis(precision.loss_scale_hysteresis)
      .min_scale(precision.loss_scale_min);
}

// Every rank of a tensor-parallel group computes on the same micro-batch: a trainer that
// indexes its data by world rank instead of mesh().coord().dp would train garbage.
void check_same_input(Communicator& tp, const torch::Tensor& input) {
  const torch::Tensor bytes = input.cpu().contiguous().view({-1}).view(torch::kUInt8);
  std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a over the input's bytes
  const auto* data = bytes.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < bytes.numel(); ++i) hash = (hash ^ data[i]) * 1099511628211ULL;
  const std::vector<int> differing = ranks_differing_from_root(tp, hash);
  PARALLAX_CHECK(differing.empty(), UsageError, "the first forward's input differs across tensor-parallel group '",
                 tp.name(), "': rank(s) ", format_rank_set(differing),
                 " got other data than its rank 0; index the data by mesh().coord().dp, not by world rank");
}

// The window's routing on this rank; each layer's tokens per expert summed over the
// replicas (its token group) in one all-reduce, for the imbalance over the global batch.
StepTelemetry::RoutingActivity routing_activity(const std::vector<expert_parallel::MoeLayerImpl*>& moe_layers,
                                                Communicator& replicas) {
  StepTelemetry::RoutingActivity activity;
  activity.layers = static_cast<std::int64_t>(moe_layers.size());
  std::vector<expert_parallel::RoutingStats> stats;
  std::vector<torch::Tensor> counts;
  for (auto* layer : moe_layers) {
    stats.push_back(layer->take_stats());
    const expert_parallel::RoutingStats& s = stats.back();
    const expert_parallel::MoeOptions& o = layer->options();
    activity.forwards += s.forwards;
    activity.aux_loss += o.aux_loss_coef() * s.balance_loss + o.z_loss_coef() * s.z_loss;
    activity.balance_loss += s.balance_loss;
    activity.z_loss += s.z_loss;
    activity.choices += s.choices;
    activity.dropped += s.dropped;
    counts.push_back(torch::tensor(s.tokens_per_expert, torch::kInt64));
  }
  if (replicas.size() > 1) sum_in_place(replicas, counts);
  for (const torch::Tensor& layer_counts : counts) {
    expert_parallel::RoutingStats global;
    global.tokens_per_expert.assign(layer_counts.data_ptr<std::int64_t>(),
                                    layer_counts.data_ptr<std::int64_t>() + layer_counts.numel());
    activity.imbalance = std::max(activity.imbalance, global.imbalance());
  }
  return activity;
}

}  // namespace

StepApplier::StepApplier(Runtime& runtime,
                         const proto::Plan& engine_plan,
                         const std::string& name,
                         std::shared_ptr<torch::nn::Module> model,
                         const OptimizerSpec& spec,
                         const StageCoupling* stage)
    : runtime_(&runtime),
      plan_(std::make_unique<proto::Plan>(engine_plan)),
      name_(name),
      model_(std::move(model)),
      spec_(spec) {
  const MemoryPhase phase("building the engine");
  const proto::Plan& plan = *plan_;
  check_beside_other_engines(runtime, name_, *model_);
  // optimizer.no_decay's group, by the kinds of the model's own modules (before any
  // strategy replaces them), under the whole model's names.
  exempt_from_weight_decay(
      spec_, *model_,
      [stage](const std::string& name) { return stage == nullptr ? name : whole_model_name(*stage, name); },
      [stage](const torch::Tensor& p) -> std::optional<bool> {
        if (stage == nullptr) return std::nullopt;
        const auto found = stage->tied_exempt.find(p.unsafeGetTensorImpl());
        return found == stage->tied_exempt.end() ? std::nullopt : std::optional<bool>(found->second);
      });
  const std::string& root = runtime.config().checkpoint.dir;
  checkpoint_root_ = root.empty() || name_.empty() ? root : root + "/" + name_;
  const int pp = plan.degrees().pp();
  PARALLAX_CHECK(pp == 1 || stage != nullptr, ConfigError, "parallel.pp = ", pp,
                 ": a pipeline needs the model as layer specs, so that each stage builds only its own layers; "
                 "build a parallax::PipelineEngine (runtime/pipeline_engine.h) instead of rt.engine(model)");
  const PrecisionOptions precision = precision_options(plan);
  const int zero_stage = zero_options(plan).stage;
  dtype_ = compute_dtype_for(precision.dtype);
  // A weight shared by two modules (a tied embedding and LM head) appears twice in
  // parameters(): keep the first, or it would be reduced and stepped twice.
  std::vector<torch::Tensor> unique;
  std::unordered_set<const void*> seen;
  for (const auto& p : model_->parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  PARALLAX_CHECK(!unique.empty(), UsageError, "the model has no parameters to train");
  device_ = runtime.device();
  if (device_.is_cuda()) {
    // Every later step (the tensor-parallel split, the broadcasts, ZeRO's flat buffers)
    // then works on the GPU; Module::to keeps each parameter's identity.
    for (const auto& p : unique) {
      PARALLAX_CHECK(!zero::is_deferred(p), ConfigError,
                     "train.device = \"cuda\": a model built under DeferredConstruction cannot be moved to the GPU "
                     "in this build; build it eagerly, or train on the CPU");
    }
    model_->to(device_);
  }
  // The registered strategies, in their order (strategy_steps.h).
  Preparation preparation{runtime, plan, stage, *model_, unique, dtype_};
  for (const StepDef& def : strategy_steps()) {
    if (!def.applies(plan, stage)) continue;
    steps_.push_back(def.make());
    steps_.back()->prepare(preparation);
    if (const auto* split = steps_.back()->tensor_split()) split_ = split;
  }
  if (dtype_ != torch::kFloat32) model_->to(dtype_);
  moe_layers_ = expert_parallel::moe_layers(*model_);

  // model->to() may have replaced the tensors: collect the trainable ones again, each
  // under the whole model's name (a stage's module paths mapped), for checkpoints.
  seen.clear();
  for (const auto& item : model_->named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    params_.push_back(p);
    param_names_.push_back(stage == nullptr ? item.key() : whole_model_name(*stage, item.key()));
  }
  PARALLAX_CHECK(!params_.empty(), UsageError, "every parameter of the model is frozen (requires_grad = false)");
  // How the model is split beyond the data-parallel group, for the norm and the
  // partial (sequence-parallel) gradients: each step says its part.
  ModelSplit model_split;
  model_split.norm_weights.assign(params_.size(), 1.0);
  for (const auto& step : steps_) step->describe(params_, model_split);
  if (model_split.norm_groups.empty()) model_split.norm_weights.clear();
  if (precision.dtype == Dtype::kFp16) {
    scaler_ = std::make_unique<zero::LossScaler>(loss_scaler_options(precision));
  }
  telemetry_ = std::make_unique<StepTelemetry>(runtime, plan);
  reduction_ =
      make_gradient_reduction(runtime, plan, *model_, params_, dtype_, optimizer_groups(spec_, param_names_),
                              std::move(model_split));
  if (spec_.zero_grad_sentinel.defined()) reduction_->watch_zero_grad(spec_.zero_grad_sentinel);
  if (zero_stage == 3) {
    Communicator& replicas = runtime.mesh().replicas();
    evaluation_ =
        replicas.split(0, replicas.rank(),
                       "evaluation forward at zero.stage = 3 (under NoGradGuard: every data-parallel rank runs it)");
  }
  runtime.engines().push_back(this);
  const CheckpointOptions& checkpoints = runtime.config().checkpoint;
  if (!checkpoints.dir.empty() && checkpoints.preemption) preemption_ = std::make_unique<PreemptionSignals>();
  FlightRecorder::instance().set_step(global_step_ + 1);  // the step in progress, for failure reports
}

StepApplier::~StepApplier() {
  auto& engines = runtime_->engines();
  engines.erase(std::remove(engines.begin(), engines.end(), this), engines.end());
}

StepApplier::PeerScopes StepApplier::peer_scopes() const {
  PeerScopes scopes;
  for (const StepApplier* other : runtime_->engines()) {
    if (other != this) scopes.add(other->reduction_->use_scope());
  }
  return scopes;
}

void StepApplier::begin_window() {
  telemetry_->begin_window_if_needed();
}

ForwardScope StepApplier::forward_scope() {
  if (evaluation_ && !torch::GradMode::is_enabled()) {
    torch::Tensor every_rank = torch::ones({1}, torch::kInt64);
    evaluation_->all_reduce(every_rank)->wait();
  }
  begin_window();
  return ForwardScope{tracer().span("forward", "compute"), model_scope()};
}

ModelScope StepApplier::model_scope() const {
  ModelScope scope{reduction_->use_scope(), {}};
  for (const auto& step : steps_) {
    if (auto opened = step->forward_scope()) scope.steps.push_back(std::move(opened));
  }
  return scope;
}

torch::Tensor StepApplier::local_part(const torch::Tensor& micro_batch) const {
  torch::Tensor part = micro_batch;
  for (const auto& step : steps_) part = step->local_part(part);
  return part;
}

std::shared_ptr<context_parallel::ContextParallel> StepApplier::context_parallel() const {
  for (const auto& step : steps_) {
    if (auto context = step->context()) return context;
  }
  return nullptr;
}

torch::Tensor StepApplier::prepare_input(const torch::Tensor& input) {
  if (split_ && !input_checked_) {
    input_checked_ = true;
    check_same_input(runtime_->mesh().tp(), input);
  }
  torch::Tensor placed = input.device() == device_ ? input : input.to(device_);
  if (placed.is_floating_point() && placed.scalar_type() != dtype_) return placed.to(dtype_);
  return placed;
}

void StepApplier::apply_step(double local_loss) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    PARALLAX_CHECK(params_[i].requires_grad(), UsageError, "parameter '", param_names_[i],
                   "' no longer requires grad, but the engine built over it steps it (a zero gradient still moves "
                   "it through the optimizer's momentum and weight decay, where the plain program's optimizer "
                   "would skip it): freeze parameters before building the engine, or build a new one");
  }
  const double lr = learning_rate(spec_, global_step_);
  const double scale = loss_scale();
  zero::StepOutcome outcome;
  {
    auto span = tracer().span("optimizer", "compute");
    outcome = reduction_->step(lr, scale, spec_.optimizer.grad_clip, scaler_ != nullptr);
  }
  if (scaler_ && scaler_->update(outcome.skipped)) {
    runtime_->logger().summary("warning: step ", global_step_ + 1, " skipped: fp16 gradients overflowed at loss scale ",
                               scale, "; next scale ", scaler_->scale(), " (", scaler_->skipped_steps(),
                               " skipped so far)");
  }
  ++global_step_;
  FlightRecorder::instance().set_step(global_step_ + 1);
  if (!moe_layers_.empty())
    telemetry_->set_routing_activity(routing_activity(moe_layers_, runtime_->mesh().replicas()));
  last_ = telemetry_->end_window(global_step_, local_loss, lr, outcome.grad_norm, model_state_bytes());
}

std::size_t StepApplier::parameter_index(const torch::Tensor& param) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return i;
  }
  throw UsageError("parameter_index: the tensor is not a trained parameter of this engine");
}

torch::Tensor StepApplier::cross_entropy(const torch::Tensor& logits, const torch::Tensor& raw_targets) const {
  // Targets come from the trainer's data, on the host: they go where the logits are.
  const torch::Tensor targets = raw_targets.device() == logits.device() ? raw_targets : raw_targets.to(logits.device());
  const std::int64_t vocabulary = split_ ? split_->split_output_vocabulary() : 0;
  if (vocabulary > 0) {
    return tensor_parallel::vocab_parallel_cross_entropy(logits, targets, vocabulary, runtime_->mesh().tp());
  }
  return dense_cross_entropy(logits, targets);
}

double StepApplier::loss_scale() const {
  return scaler_ ? scaler_->scale() : 1.0;
}
std::int64_t StepApplier::skipped_steps() const {
  return scaler_ ? scaler_->skipped_steps() : 0;
}
ModelStateBytes StepApplier::model_state_bytes() const {
  return reduction_->model_state_bytes();
}
std::vector<torch::Tensor> StepApplier::master_parameters() const {
  return reduction_->master_parameters();
}
const zero::ShardedModel* StepApplier::sharded_model() const {
  return reduction_->sharded_model();
}
Tracer& StepApplier::tracer() {
  return runtime_->tracer();
}

void StepApplier::run_model(const std::function<void()>& body) const {
  try {
    body();
  } catch (const c10::Error&) {
    explain_missing_kernel();
    throw;
  }
}

void StepApplier::explain_missing_kernel() const {
  try {
    throw;
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (dtype_ == torch::kFloat32 || what.find("not implemented for '") == std::string::npos) return;
    const Dtype dtype = precision_options(*plan_).dtype;
    const bool fp16 = dtype == Dtype::kFp16;
    throw ConfigError(std::string("precision.dtype = \"") + to_string(dtype) + "\"" +
                      recorded_position(*plan_, "precision.dtype") + ": LibTorch " + TORCH_VERSION +
                      " has no kernel for one of this model's operations in that dtype on this device (" +
                      what.substr(0, what.find('\n')) + "); use precision.dtype = " +
                      (fp16 ? "\"bf16\" (the same 2 bytes with fp32's range, no loss scaling)" : "\"fp32\""));
  }
}

torch::Tensor dense_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

}  // namespace parallax
