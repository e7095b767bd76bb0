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
#include "parallax/runtime/gradient_reduction.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"
#include "parallax/runtime/step_telemetry.h"
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

// Rank 0 of the tensor-parallel group says how the model was split.
void describe_split(Runtime& runtime, const proto::Plan& plan, const tensor_parallel::ParallelizedModel& split) {
  runtime.logger().summary("# tensor parallel: tp = ", plan.degrees().tp(), ", sequence parallel ",
                           tensor_parallel_options(plan).sequence_parallel ? "on" : "off");
  for (const std::string& line : split.describe()) runtime.logger().summary("#   ", line);
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
  const proto::Plan& plan = *plan_;
  check_beside_other_engines(runtime, name_, *model_);
  const std::string& root = runtime.config().checkpoint.dir;
  checkpoint_root_ = root.empty() || name_.empty() ? root : root + "/" + name_;
  const int pp = plan.degrees().pp();
  PARALLAX_CHECK(pp == 1 || stage != nullptr, ConfigError, "parallel.pp = ", pp,
                 ": a pipeline needs the model as layer specs, so that each stage builds only its own layers; "
                 "build a parallax::PipelineEngine (runtime/pipeline_engine.h) instead of rt.engine(model)");
  const PrecisionOptions precision = precision_options(plan);
  const int zero_stage = zero_options(plan).stage;
  dtype_ = compute_dtype_for(precision.dtype);
  Communicator& dp = runtime.mesh().dp();
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
  if (plan.degrees().tp() > 1) {
    // A plan slices the dense model each rank holds: make them the same one first.
    Communicator& tp = runtime.mesh().tp();
    const TensorParallelOptions tp_options = tensor_parallel_options(plan);
    if (!tp_options.plan.empty()) {
      // A plan slices whole weights: a model built under DeferredConstruction is
      // materialized first (each rank then holds the dense model once, briefly).
      for (const auto& p : unique) {
        if (zero::is_deferred(p)) zero::materialize(p);
      }
      check_same_structure(tp, unique, model_->buffers());
      broadcast_from_first(tp, unique, model_->buffers());
    }
    Communicator& world = runtime.mesh().world();
    if (stage == nullptr) {
      split_ = split_everywhere(world, *model_, tp_options, tp, {});
    } else {
      split_ = split_pipeline_stage(*model_, tp_options, world, tp, runtime.mesh().pp(), stage->plan_path);
    }
    describe_split(runtime, plan, *split_);
  }
  check_same_structure(dp, unique, model_->buffers());

  // Parameters built under zero::DeferredConstruction hold no data yet. Stage 3 gives
  // each its data unit by unit while sharding; the other stages hold every parameter
  // anyway. Either way they are identical on every rank (same seed), so not broadcast.
  std::unordered_set<const void*> deferred;
  for (const auto& p : unique) {
    if (zero::is_deferred(p)) deferred.insert(p.unsafeGetTensorImpl());
  }
  if (!deferred.empty()) {
    PARALLAX_CHECK(zero_stage == 3 ? dtype_ == torch::kFloat32 : true, ConfigError,
                   "a model built under DeferredConstruction trains in fp32 at zero.stage = 3 in this build "
                   "(precision.dtype = bf16/fp16 would materialize it whole); build it eagerly or use fp32");
    if (zero_stage < 3) {
      for (const auto& p : unique) zero::materialize(p);
      deferred.clear();
    }
  }

  // Every data-parallel rank starts from rank 0's parameters and buffers (fp32, exact).
  {
    std::vector<torch::Tensor> present;
    for (const auto& t : unique) {
      if (!deferred.count(t.unsafeGetTensorImpl())) present.push_back(t);
    }
    broadcast_from_first(dp, present, model_->buffers());
  }
  if (dtype_ != torch::kFloat32) model_->to(dtype_);

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
  // partial (sequence-parallel) gradients.
  ModelSplit model_split;
  model_split.partial_backwards = stage != nullptr;  // a pipeline backward covers one chunk
  if (split_) model_split.norm_groups.push_back(&runtime.mesh().tp());
  if (stage != nullptr) model_split.norm_groups.push_back(&runtime.mesh().pp());
  if (!model_split.norm_groups.empty()) {
    std::unordered_set<const void*> excluded;
    if (stage != nullptr) {
      for (const auto& t : stage->norm_excluded) excluded.insert(t.unsafeGetTensorImpl());
    }
    for (const auto& p : params_) {
      const double copies = split_ ? static_cast<double>(split_->copies(p)) : 1.0;
      model_split.norm_weights.push_back(excluded.count(p.unsafeGetTensorImpl()) ? 0.0 : 1.0 / copies);
    }
  }
  if (split_) {
    model_split.tp = &runtime.mesh().tp();
    std::unordered_set<const void*> partial;
    for (const auto& p : split_->partial_gradient_parameters()) partial.insert(p.unsafeGetTensorImpl());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (partial.count(params_[i].unsafeGetTensorImpl())) model_split.partial.push_back(i);
    }
  }
  if (precision.dtype == Dtype::kFp16) {
    scaler_ = std::make_unique<zero::LossScaler>(loss_scaler_options(precision));
  }
  telemetry_ = std::make_unique<StepTelemetry>(runtime, plan);
  reduction_ =
      make_gradient_reduction(runtime, plan, *model_, params_, dtype_, spec_.optimizer, std::move(model_split));
  if (spec_.zero_grad_sentinel.defined()) reduction_->watch_zero_grad(spec_.zero_grad_sentinel);
  if (zero_stage == 3) {
    evaluation_ = dp.split(
        0, dp.rank(), "evaluation forward at zero.stage = 3 (under NoGradGuard: every data-parallel rank runs it)");
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
  return ModelScope{reduction_->use_scope(), split_ ? split_->scope() : tensor_parallel::ParallelizedModel::Scope()};
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
