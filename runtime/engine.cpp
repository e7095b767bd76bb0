#include "parallax/runtime/engine.h"

#include <torch/nn/functional/loss.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/core/world.h"
#include "parallax/runtime/gradient_reduction.h"
#include "parallax/runtime/step_telemetry.h"
#include "parallax/tensor_parallel/vocab_parallel.h"
#include "parallax/zero/deferred_construction.h"
#include "parallax/zero/loss_scaler.h"

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
void describe_split(Runtime& runtime, const tensor_parallel::ParallelizedModel& split) {
  const Config& config = runtime.config();
  runtime.logger().summary("# tensor parallel: tp = ", config.parallel.tp, ", sequence parallel ",
                           config.tensor_parallel.sequence_parallel ? "on" : "off");
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
std::unique_ptr<tensor_parallel::ParallelizedModel> split_pipeline_stage(
    torch::nn::Module& stage,
    const TensorParallelOptions& options,
    Communicator& tp,
    Communicator& pp,
    const std::function<std::string(const std::string&)>& plan_path) {
  std::unique_ptr<tensor_parallel::ParallelizedModel> split;
  try {
    run_everywhere(pp, "[tensor_parallel.plan]", [&] {
      split = std::make_unique<tensor_parallel::ParallelizedModel>(
          stage, options, tp, tensor_parallel::ParallelizeOptions{plan_path, true});
    });
  } catch (const UsageError& e) {
    throw ConfigError(e.detail());  // another stage's plan failed
  }
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

struct Engine::State {
  Runtime* runtime = nullptr;
  std::shared_ptr<torch::nn::Module> model;
  OptimizerSpec spec;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<torch::Tensor> params;  ///< the model's trainable ones (compute dtype)
  std::unique_ptr<GradientReduction> reduction;
  std::unique_ptr<zero::LossScaler> scaler;  ///< fp16
  std::unique_ptr<StepTelemetry> telemetry;
  std::unique_ptr<tensor_parallel::ParallelizedModel> split;  ///< parallel.tp > 1
  mutable bool input_checked = false;

  std::int64_t grad_accum = 1;
  std::int64_t micro_step = 0;  ///< backward calls in the current window
  std::int64_t global_step = 0;
  torch::Tensor loss_sum;  ///< sum of micro-step losses in the window (float64)
  StepMetrics last;
};

Engine::Engine(Runtime& runtime, std::shared_ptr<torch::nn::Module> model, const OptimizerSpec& spec)
    : Engine(runtime, std::move(model), spec, nullptr) {}

Engine::Engine(Runtime& runtime,
               std::shared_ptr<torch::nn::Module> model,
               const OptimizerSpec& spec,
               const PipelineCoupling& coupling)
    : Engine(runtime, std::move(model), spec, &coupling) {}

Engine::Engine(Runtime& runtime,
               std::shared_ptr<torch::nn::Module> model,
               const OptimizerSpec& spec,
               const PipelineCoupling* coupling)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  const Config& config = runtime.config();
  PARALLAX_CHECK(config.parallel.pp == 1 || coupling != nullptr, ConfigError, "parallel.pp = ", config.parallel.pp,
                 ": a pipeline needs the model as layer specs, so that each stage builds only its own layers; "
                 "build a parallax::PipelineEngine (runtime/pipeline_engine.h) instead of rt.engine(model)");
  s.runtime = &runtime;
  s.model = std::move(model);
  s.spec = spec;
  s.dtype = compute_dtype_for(config.precision.dtype);
  s.grad_accum = config.train.grad_accum;
  Communicator& dp = runtime.mesh().dp();
  // A weight shared by two modules (a tied embedding and LM head) appears twice in
  // parameters(): keep the first, or it would be reduced and stepped twice.
  std::vector<torch::Tensor> unique;
  std::unordered_set<const void*> seen;
  for (const auto& p : s.model->parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  PARALLAX_CHECK(!unique.empty(), UsageError, "the model has no parameters to train");
  if (config.parallel.tp > 1) {
    // A plan slices the dense model each rank holds: make them the same one first.
    Communicator& tp = runtime.mesh().tp();
    if (!config.tensor_parallel.plan.empty()) {
      // A plan slices whole weights: a model built under DeferredConstruction is
      // materialized first (each rank then holds the dense model once, briefly).
      for (const auto& p : unique) {
        if (zero::is_deferred(p)) zero::materialize(p);
      }
      check_same_structure(tp, unique, s.model->buffers());
      broadcast_from_first(tp, unique, s.model->buffers());
    }
    if (coupling == nullptr) {
      s.split = std::make_unique<tensor_parallel::ParallelizedModel>(*s.model, config.tensor_parallel, tp);
    } else {
      s.split = split_pipeline_stage(*s.model, config.tensor_parallel, tp, runtime.mesh().pp(), coupling->plan_path);
    }
    describe_split(runtime, *s.split);
  }
  check_same_structure(dp, unique, s.model->buffers());

  // Parameters built under zero::DeferredConstruction hold no data yet. Stage 3 gives
  // each its data unit by unit while sharding; the other stages hold every parameter
  // anyway. Either way they are identical on every rank (same seed), so not broadcast.
  std::unordered_set<const void*> deferred;
  for (const auto& p : unique) {
    if (zero::is_deferred(p)) deferred.insert(p.unsafeGetTensorImpl());
  }
  if (!deferred.empty()) {
    PARALLAX_CHECK(config.zero.stage == 3 ? s.dtype == torch::kFloat32 : true, ConfigError,
                   "a model built under DeferredConstruction trains in fp32 at zero.stage = 3 in this build "
                   "(precision.dtype = bf16/fp16 would materialize it whole); build it eagerly or use fp32");
    if (config.zero.stage < 3) {
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
    broadcast_from_first(dp, present, s.model->buffers());
  }
  if (s.dtype != torch::kFloat32) s.model->to(s.dtype);

  // model->to() may have replaced the tensors: collect the trainable ones again.
  seen.clear();
  for (const auto& p : s.model->parameters()) {
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) s.params.push_back(p);
  }
  PARALLAX_CHECK(!s.params.empty(), UsageError, "every parameter of the model is frozen (requires_grad = false)");
  // How the model is split beyond the data-parallel group, for the norm and the
  // partial (sequence-parallel) gradients.
  ModelSplit model_split;
  model_split.partial_backwards = coupling != nullptr;  // a pipeline backward covers one chunk
  if (s.split) model_split.norm_groups.push_back(&runtime.mesh().tp());
  if (coupling != nullptr) model_split.norm_groups.push_back(&runtime.mesh().pp());
  if (!model_split.norm_groups.empty()) {
    std::unordered_set<const void*> excluded;
    if (coupling != nullptr) {
      for (const auto& t : coupling->norm_excluded) excluded.insert(t.unsafeGetTensorImpl());
    }
    for (const auto& p : s.params) {
      const double copies = s.split ? static_cast<double>(s.split->copies(p)) : 1.0;
      model_split.norm_weights.push_back(excluded.count(p.unsafeGetTensorImpl()) ? 0.0 : 1.0 / copies);
    }
  }
  if (s.split) {
    model_split.tp = &runtime.mesh().tp();
    std::unordered_set<const void*> partial;
    for (const auto& p : s.split->partial_gradient_parameters()) partial.insert(p.unsafeGetTensorImpl());
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      if (partial.count(s.params[i].unsafeGetTensorImpl())) model_split.partial.push_back(i);
    }
  }
  if (config.precision.dtype == Dtype::kFp16) {
    s.scaler = std::make_unique<zero::LossScaler>(loss_scaler_options(config.precision));
    if (s.params.front().is_cpu()) {
      runtime.logger().summary(
          "note: precision.dtype = \"fp16\" on CPU: LibTorch 1.13 has no CPU fp16 kernels for matmul or "
          "layer_norm; a model that uses them fails in its first forward (use bf16 on CPU)");
    }
  }
  s.telemetry = std::make_unique<StepTelemetry>(runtime);
  s.loss_sum = torch::zeros({}, torch::kFloat64);
  s.reduction = make_gradient_reduction(runtime, *s.model, s.params, s.dtype, spec.optimizer, std::move(model_split));
}

Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

void Engine::backward(const torch::Tensor& loss) {
  State& s = *state_;
  PARALLAX_CHECK(loss.dim() == 0, UsageError, "backward: loss must be a scalar, got shape ", loss.sizes());
  PARALLAX_CHECK(s.micro_step < s.grad_accum, UsageError, "backward called ", s.micro_step + 1,
                 " times without step(); train.grad_accum = ", s.grad_accum);
  begin_micro_step();
  ++s.micro_step;
  const bool last = s.micro_step == s.grad_accum;
  auto span = tracer().span("backward", "compute");
  s.loss_sum += loss.detach().to(torch::kFloat64);
  const double scale = (s.scaler ? s.scaler->scale() : 1.0) / static_cast<double>(s.grad_accum);
  s.reduction->run_backward(last ? pipeline::WeightGradients::kLast : pipeline::WeightGradients::kSome,
                            [&] { (loss * scale).backward(); });
}

bool Engine::step() {
  State& s = *state_;
  if (s.micro_step < s.grad_accum) return false;
  s.micro_step = 0;
  s.reduction->finish();
  const double local_loss = s.loss_sum.item<double>() / static_cast<double>(s.grad_accum);
  s.loss_sum.zero_();
  apply_step(local_loss);
  return true;
}

void Engine::apply_step(double local_loss) {
  State& s = *state_;
  const double lr = scheduled_lr(s.spec, s.global_step);
  const double loss_scale = s.scaler ? s.scaler->scale() : 1.0;
  zero::StepOutcome outcome;
  {
    auto span = tracer().span("optimizer", "compute");
    outcome = s.reduction->step(lr, loss_scale, s.spec.optimizer.grad_clip, s.scaler != nullptr);
  }
  if (s.scaler && s.scaler->update(outcome.skipped)) {
    s.runtime->logger().summary("warning: step ", s.global_step + 1,
                                " skipped: fp16 gradients overflowed at loss scale ", loss_scale, "; next scale ",
                                s.scaler->scale(), " (", s.scaler->skipped_steps(), " skipped so far)");
  }
  ++s.global_step;
  s.last = s.telemetry->end_window(s.global_step, local_loss, lr, outcome.grad_norm, model_state_bytes());
}

GradientReduction& Engine::gradient_reduction() {
  return *state_->reduction;
}

std::size_t Engine::parameter_index(const torch::Tensor& param) const {
  const State& s = *state_;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return i;
  }
  throw UsageError("parameter_index: the tensor is not a trained parameter of this engine");
}

StepTelemetry& Engine::step_telemetry() {
  return *state_->telemetry;
}

std::int64_t Engine::global_step() const {
  return state_->global_step;
}
std::int64_t Engine::grad_accum() const {
  return state_->grad_accum;
}
double Engine::last_loss() const {
  return state_->last.loss;
}
double Engine::last_lr() const {
  return state_->last.lr;
}
const StepMetrics& Engine::last_metrics() const {
  return state_->last;
}
torch::ScalarType Engine::compute_dtype() const {
  return state_->dtype;
}
std::int64_t Engine::gradient_bytes() const {
  return state_->reduction->gradient_bytes();
}
std::int64_t Engine::gradient_padding_bytes() const {
  return state_->reduction->gradient_padding_bytes();
}
std::size_t Engine::bucket_count() const {
  return state_->reduction->bucket_count();
}
const zero::ShardedModel* Engine::sharded_model() const {
  return state_->reduction->sharded_model();
}
double Engine::loss_scale() const {
  return state_->scaler ? state_->scaler->scale() : 1.0;
}
std::int64_t Engine::skipped_steps() const {
  return state_->scaler ? state_->scaler->skipped_steps() : 0;
}
tensor_parallel::ParallelizedModel::Scope Engine::tensor_parallel_scope() const {
  return state_->split ? state_->split->scope() : tensor_parallel::ParallelizedModel::Scope(false);
}
zero::ParameterUseScope Engine::parameter_use_scope() const {
  return state_->reduction->use_scope();
}
void Engine::set_tokens_per_sample(std::int64_t tokens) {
  state_->telemetry->set_tokens_per_sample(tokens);
}

std::vector<torch::Tensor> Engine::master_parameters() const {
  return state_->reduction->master_parameters();
}

ModelStateBytes Engine::model_state_bytes() const {
  return state_->reduction->model_state_bytes();
}

void Engine::begin_micro_step() {
  state_->telemetry->begin_window_if_needed();
}

torch::Tensor Engine::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) const {
  const std::int64_t vocabulary = state_->split ? state_->split->split_output_vocabulary() : 0;
  if (vocabulary > 0) {
    return tensor_parallel::vocab_parallel_cross_entropy(logits, targets, vocabulary, state_->runtime->mesh().tp());
  }
  return dense_cross_entropy(logits, targets);
}

torch::Tensor dense_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

torch::Tensor Engine::prepare_input(const torch::Tensor& input) const {
  if (state_->split && !state_->input_checked) {
    state_->input_checked = true;
    check_same_input(state_->runtime->mesh().tp(), input);
  }
  if (input.is_floating_point() && input.scalar_type() != state_->dtype) return input.to(state_->dtype);
  return input;
}

Tracer& Engine::tracer() {
  return state_->runtime->tracer();
}

}  // namespace parallax
