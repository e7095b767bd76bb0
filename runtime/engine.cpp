#include "parallax/runtime/engine.h"

#include <torch/nn/functional/loss.h>
#include <torch/nn/utils/clip_grad.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <unordered_set>

#include "parallax/core/config_loader.h"
#include "parallax/core/cpu_binding.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/core/world.h"
#include "parallax/offload/cpu_adam.h"
#include "parallax/offload/offloaded_adam.h"
#include "parallax/runtime/gradient_buckets.h"
#include "parallax/runtime/step_telemetry.h"
#include "parallax/tensor_parallel/vocab_parallel.h"
#include "parallax/zero/deferred_construction.h"
#include "parallax/zero/loss_scaler.h"
#include "parallax/zero/sharded_model.h"

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

// The CPU Adam streams memory: keep its threads on this rank's own cores, and say where.
void bind_offload_threads(Runtime& runtime, const zero::ShardedModel& sharded) {
  const World& world = runtime.world();
  const std::vector<int> pus = rank_cpu_share(world.local_rank(), world.local_size());
  const std::vector<int> bound = offload::CpuAdam::bind_threads(pus);
  std::string where;
  for (std::size_t t = 0; t < bound.size(); ++t) where += (t ? "," : "") + std::to_string(bound[t]);
  const OffloadOptions& offload = runtime.config().offload;
  runtime.logger().summary("# offload: optimizer ", to_string(offload.optimizer), ", param ", to_string(offload.param),
                           "; fused CPU Adam (", offload::CpuAdam::instruction_set(), "), rank 0's ", bound.size(),
                           " intra-op thread(s) bound to PU(s) {", where, "}; rank 0 holds ", sharded.host_bytes(),
                           " bytes on the host and ", sharded.nvme_bytes(), " in the NVMe tier");
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

// The global gradient norm of a model split over other ranks (tensor or pipeline
// parallel): each parameter's squares times its weight (1 / the ranks holding the same
// elements; 0 for a tied copy another stage counts), summed in float64 over `groups`, and
// clipping as torch::nn::utils::clip_grad_norm_ does (clip > 0). Returns the norm (not
// finite: nothing clipped); every rank of the groups reaches the same value.
double clip_model_parallel_gradients(const std::vector<torch::Tensor>& optimized,
                                     const std::vector<double>& weights,
                                     const std::vector<Communicator*>& groups,
                                     double clip) {
  torch::NoGradGuard no_grad;
  torch::Tensor squares = torch::zeros({1}, optimized.front().options().dtype(torch::kFloat64));
  for (std::size_t i = 0; i < optimized.size(); ++i) {
    if (weights[i] == 0.0 || !optimized[i].grad().defined()) continue;
    squares.add_(optimized[i].grad().to(torch::kFloat64).pow(2).sum() * weights[i]);
  }
  for (Communicator* group : groups) group->all_reduce(squares)->wait();
  const double norm = std::sqrt(squares.item<double>());
  if (std::isfinite(norm) && clip > 0 && clip / (norm + 1e-6) < 1.0) {
    for (const auto& p : optimized) {
      if (p.grad().defined()) p.grad().mul_(clip / (norm + 1e-6));
    }
  }
  return norm;
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
  std::exception_ptr error;
  try {
    split = std::make_unique<tensor_parallel::ParallelizedModel>(stage, options, tp,
                                                                 tensor_parallel::ParallelizeOptions{plan_path, true});
  } catch (const ConfigError&) {
    error = std::current_exception();
  }
  // [failed stages, then per rule: stages it matched on]
  torch::Tensor counts = torch::zeros({static_cast<std::int64_t>(options.plan.size()) + 1}, torch::kLong);
  counts[0] = error ? 1 : 0;
  if (split) {
    const std::vector<bool> matched = split->rules_matched();
    for (std::size_t i = 0; i < matched.size(); ++i) counts[static_cast<std::int64_t>(i) + 1] = matched[i] ? 1 : 0;
  }
  pp.all_reduce(counts, {ReduceOp::kSum})->wait();
  if (error) std::rethrow_exception(error);
  const auto* count = counts.data_ptr<std::int64_t>();
  PARALLAX_CHECK(count[0] == 0, ConfigError, "[tensor_parallel.plan] failed on ", count[0],
                 " other pipeline stage(s); see their messages");
  for (std::size_t i = 0; i < options.plan.size(); ++i) {
    const TpPlanRule& rule = options.plan[i];
    PARALLAX_CHECK(count[i + 1] > 0, ConfigError, "[tensor_parallel.plan] \"", rule.pattern, "\"", rule.position,
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
  std::vector<torch::Tensor> params;                   ///< the model's (compute dtype)
  std::vector<torch::Tensor> masters;                  ///< stage 0: fp32 copies under bf16/fp16; empty under fp32
  std::unique_ptr<GradientBuckets> buckets;            ///< stage 0
  std::unique_ptr<torch::optim::Optimizer> optimizer;  ///< stage 0
  std::unique_ptr<zero::ShardedModel> sharded;         ///< stages 1–3
  std::unique_ptr<zero::LossScaler> scaler;            ///< fp16
  std::unique_ptr<StepTelemetry> telemetry;
  std::unique_ptr<tensor_parallel::ParallelizedModel> split;  ///< parallel.tp > 1
  std::vector<std::size_t> partial_gradients;  ///< indices into params summed over tp (sequence parallel)
  bool pipeline = false;                       ///< a pipeline stage: the norm is summed over pp
  std::vector<double> norm_weights;  ///< per param, when split or pipeline (see clip_model_parallel_gradients)
  mutable bool input_checked = false;

  std::int64_t grad_accum = 1;
  std::int64_t micro_step = 0;  ///< backward calls in the current window
  std::int64_t global_step = 0;
  torch::Tensor loss_sum;  ///< sum of micro-step losses in the window (float64)
  StepMetrics last;

  const std::vector<torch::Tensor>& optimized() const { return masters.empty() ? params : masters; }
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
  // The runtime's strategy matrix has refused what this engine cannot compose.
  s.pipeline = coupling != nullptr;
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
  if (s.split || s.pipeline) {
    std::unordered_set<const void*> excluded;
    if (coupling != nullptr) {
      for (const auto& t : coupling->norm_excluded) excluded.insert(t.unsafeGetTensorImpl());
    }
    for (const auto& p : s.params) {
      const double copies = s.split ? static_cast<double>(s.split->copies(p)) : 1.0;
      s.norm_weights.push_back(excluded.count(p.unsafeGetTensorImpl()) ? 0.0 : 1.0 / copies);
    }
  }
  if (s.split) {
    std::unordered_set<const void*> partial;
    for (const auto& p : s.split->partial_gradient_parameters()) partial.insert(p.unsafeGetTensorImpl());
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      if (partial.count(s.params[i].unsafeGetTensorImpl())) s.partial_gradients.push_back(i);
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
  if (config.zero.stage > 0) {
    const OptimizerOptions optimizer_options = spec.optimizer;
    s.sharded =
        std::make_unique<zero::ShardedModel>(*s.model, s.params, config.zero, config.offload, spec.optimizer, dp,
                                             runtime.tracer(), [&optimizer_options](std::vector<torch::Tensor> shards) {
                                               return make_optimizer(optimizer_options, std::move(shards));
                                             });
    if (s.split) {
      std::vector<std::int64_t> copies;
      std::vector<bool> partial(s.params.size(), false);
      for (const auto& p : s.params) copies.push_back(s.split->copies(p));
      for (std::size_t i : s.partial_gradients) partial[i] = true;
      s.sharded->set_model_parallel(runtime.mesh().tp(), copies, partial);
    }
    if (config.offload.optimizer_offloaded()) bind_offload_threads(runtime, *s.sharded);
    return;
  }
  const std::int64_t bucket_bytes = config.zero.bucket_bytes();
  // bf16/fp16 gradients accumulate and are reduced in fp32, straight into the masters' grads.
  const bool keep_masters = s.dtype != torch::kFloat32;
  s.buckets = std::make_unique<GradientBuckets>(
      s.params, bucket_bytes, dp, runtime.tracer(), config.zero.overlap_comm,
      keep_masters ? c10::optional<torch::ScalarType>(torch::kFloat32) : c10::nullopt);
  if (keep_masters) {
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      torch::Tensor master = s.params[i].detach().to(torch::kFloat32).clone().requires_grad_(true);
      master.mutable_grad() = s.buckets->accumulated_grad(i);
      s.masters.push_back(master);
    }
  }
  s.optimizer = make_optimizer(spec.optimizer, s.optimized());
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
  if (s.sharded) {
    s.sharded->begin_backward(last);
    {
      auto gathering = s.sharded->use_scope();
      (loss * scale).backward();
    }
    s.sharded->end_backward();
    return;
  }
  if (last) s.buckets->arm();
  (loss * scale).backward();
}

bool Engine::step() {
  State& s = *state_;
  if (s.micro_step < s.grad_accum) return false;
  s.micro_step = 0;
  reduce_gradients();
  const double local_loss = s.loss_sum.item<double>() / static_cast<double>(s.grad_accum);
  s.loss_sum.zero_();
  apply_step(local_loss);
  return true;
}

void Engine::arm_gradient_reduction() {
  if (state_->buckets) state_->buckets->arm();
}

void Engine::reduce_gradients() {
  State& s = *state_;
  if (s.sharded) return;  // ShardedModel::step finishes its own reductions
  s.buckets->finish();
  if (!s.partial_gradients.empty()) {
    std::vector<torch::Tensor> partial;
    for (std::size_t i : s.partial_gradients) partial.push_back(s.optimized()[i].grad());
    sum_in_place(s.runtime->mesh().tp(), partial);
  }
}

void Engine::apply_step(double local_loss) {
  State& s = *state_;
  const double lr = scheduled_lr(s.spec, s.global_step);
  const double loss_scale = s.scaler ? s.scaler->scale() : 1.0;
  bool overflow = false;
  double grad_norm = -1.0;
  if (s.sharded) {
    auto span = tracer().span("optimizer", "compute");
    if (offload::OffloadedAdam* host = s.sharded->offloaded_optimizer()) {
      host->set_learning_rate(lr);
    } else {
      set_learning_rate(s.sharded->optimizer(), lr);
    }
    const double gradient_scale = 1.0 / (static_cast<double>(s.runtime->mesh().dp().size()) * loss_scale);
    const zero::StepOutcome outcome = s.sharded->step(gradient_scale, s.spec.optimizer.grad_clip, s.scaler != nullptr);
    overflow = outcome.skipped;
    grad_norm = outcome.grad_norm;
  } else {
    auto span = tracer().span("optimizer", "compute");
    torch::NoGradGuard no_grad;
    if (s.scaler) {
      for (const auto& m : s.masters) m.mutable_grad().mul_(1.0 / loss_scale);
    }
    const double clip = s.spec.optimizer.grad_clip;
    if ((s.split || s.pipeline) && (clip > 0 || s.scaler)) {
      std::vector<Communicator*> groups;
      if (s.split) groups.push_back(&s.runtime->mesh().tp());
      if (s.pipeline) groups.push_back(&s.runtime->mesh().pp());
      grad_norm = clip_model_parallel_gradients(s.optimized(), s.norm_weights, groups, clip);
      overflow = s.scaler != nullptr && !std::isfinite(grad_norm);
    } else if (clip > 0 || s.scaler) {
      // One global norm serves clipping and the overflow check (an infinite threshold
      // never clips). Gradients are identical on every rank after the all-reduce, so
      // every rank reaches the same verdict without communicating; an overflowing
      // step's gradients are discarded below whatever clipping did to them.
      grad_norm =
          torch::nn::utils::clip_grad_norm_(s.optimized(), clip > 0 ? clip : std::numeric_limits<double>::infinity());
      overflow = s.scaler != nullptr && !std::isfinite(grad_norm);
    }
    if (!overflow) {
      set_learning_rate(*s.optimizer, lr);
      s.optimizer->step();
      for (std::size_t i = 0; i < s.masters.size(); ++i) s.params[i].detach().copy_(s.masters[i]);
    }
    s.buckets->zero();
  }
  if (s.scaler && s.scaler->update(overflow)) {
    s.runtime->logger().summary("warning: step ", s.global_step + 1,
                                " skipped: fp16 gradients overflowed at loss scale ", loss_scale, "; next scale ",
                                s.scaler->scale(), " (", s.scaler->skipped_steps(), " skipped so far)");
  }
  ++s.global_step;
  s.last = s.telemetry->end_window(s.global_step, local_loss, lr, grad_norm, model_state_bytes());
}

torch::Tensor Engine::reduced_gradient(const torch::Tensor& param) const {
  const State& s = *state_;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return s.optimized()[i].grad();
  }
  throw UsageError("reduced_gradient: the tensor is not a trained parameter of this engine");
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
  if (state_->sharded) {
    std::int64_t bytes = 0;
    for (const auto& p : state_->params) bytes += p.numel() * 4;  // reduced in fp32
    return bytes;
  }
  return state_->buckets->gradient_bytes();
}
std::int64_t Engine::gradient_padding_bytes() const {
  return state_->sharded ? state_->sharded->padding_elements() * 4 : state_->buckets->padding_bytes();
}
std::size_t Engine::bucket_count() const {
  return state_->sharded ? state_->sharded->group_count() : state_->buckets->bucket_count();
}
const zero::ShardedModel* Engine::sharded_model() const {
  return state_->sharded.get();
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
  return state_->sharded ? state_->sharded->use_scope() : zero::ParameterUseScope(false);
}
void Engine::set_tokens_per_sample(std::int64_t tokens) {
  state_->telemetry->set_tokens_per_sample(tokens);
}

std::vector<torch::Tensor> Engine::master_parameters() const {
  if (state_->sharded) return state_->sharded->gather_masters();
  std::vector<torch::Tensor> out;
  for (const auto& p : state_->optimized()) out.push_back(p.detach().to(torch::kFloat32));
  return out;
}

ModelStateBytes Engine::model_state_bytes() const {
  const State& s = *state_;
  ModelStateBytes bytes;
  if (s.sharded) {
    bytes.params = s.sharded->parameter_bytes();
    bytes.grads = s.sharded->gradient_bytes();
    bytes.optimizer = s.sharded->master_bytes();
    if (s.sharded->offloaded_optimizer() == nullptr) bytes.optimizer += optimizer_state_bytes(s.sharded->optimizer());
    bytes.host = s.sharded->host_bytes();
    bytes.nvme = s.sharded->nvme_bytes();
    return bytes;
  }
  for (const auto& p : s.params) bytes.params += payload_bytes(p);
  bytes.grads = s.buckets->buffer_bytes();
  bytes.optimizer = optimizer_state_bytes(*s.optimizer);
  for (const auto& m : s.masters) bytes.optimizer += payload_bytes(m);  // the fp32 master weight
  return bytes;
}

void Engine::begin_micro_step() {
  state_->telemetry->begin_window_if_needed();
}

torch::Tensor Engine::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) const {
  const std::int64_t vocabulary = state_->split ? state_->split->split_output_vocabulary() : 0;
  if (vocabulary > 0) {
    return tensor_parallel::vocab_parallel_cross_entropy(logits, targets, vocabulary, state_->runtime->mesh().tp());
  }
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
