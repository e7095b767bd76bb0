#include "parallax/runtime/engine.h"

#include <torch/nn/utils/clip_grad.h>

#include <chrono>
#include <cstdio>
#include <unordered_set>

#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/runtime/gradient_buckets.h"
#include "parallax/runtime/step_telemetry.h"

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

torch::ScalarType compute_dtype_for(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32:
      return torch::kFloat32;
    case Dtype::kBf16:
      return torch::kBFloat16;
    case Dtype::kFp16:
      break;
  }
  throw ConfigError(
      "precision.dtype = \"fp16\": fp16 needs dynamic loss scaling, which this build does not "
      "have yet; use \"fp32\" or \"bf16\"");
}

}  // namespace

struct Engine::State {
  Runtime* runtime = nullptr;
  std::shared_ptr<torch::nn::Module> model;
  OptimizerSpec spec;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<torch::Tensor> params;   ///< the model's (compute dtype)
  std::vector<torch::Tensor> masters;  ///< fp32 copies under bf16; empty under fp32
  std::unique_ptr<GradientBuckets> buckets;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<StepTelemetry> telemetry;

  std::int64_t grad_accum = 1;
  std::int64_t micro_step = 0;  ///< backward calls in the current window
  std::int64_t global_step = 0;
  torch::Tensor loss_sum;  ///< sum of micro-step losses in the window (float64)
  StepMetrics last;

  const std::vector<torch::Tensor>& optimized() const { return masters.empty() ? params : masters; }
};

Engine::Engine(Runtime& runtime, std::shared_ptr<torch::nn::Module> model, const OptimizerSpec& spec)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  const Config& config = runtime.config();
  PARALLAX_CHECK(config.parallel.tp == 1 && config.parallel.pp == 1, ConfigError, "parallel.tp = ", config.parallel.tp,
                 ", parallel.pp = ", config.parallel.pp,
                 ": tensor and pipeline parallelism are not available in this build yet; use tp = 1, pp = 1");
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
  check_same_structure(dp, unique, s.model->buffers());

  // Every data-parallel rank starts from rank 0's parameters and buffers (fp32, exact).
  {
    torch::NoGradGuard no_grad;
    std::vector<WorkPtr> pending;
    std::vector<torch::Tensor> aliases;
    for (const auto& t : unique) aliases.push_back(t.detach());
    for (const auto& t : s.model->buffers()) {
      // MPI has no bool type: a bool buffer (a mask) travels as its bytes.
      aliases.push_back(t.scalar_type() == torch::kBool ? t.detach().view(torch::kUInt8) : t.detach());
    }
    for (auto& t : aliases) {
      PARALLAX_CHECK(t.is_contiguous(), UsageError, "model tensors must be contiguous to broadcast");
      pending.push_back(dp.broadcast(t, 0));
    }
    for (auto& w : pending) w->wait();
  }
  if (s.dtype != torch::kFloat32) s.model->to(s.dtype);

  // model->to() may have replaced the tensors: collect the trainable ones again.
  seen.clear();
  for (const auto& p : s.model->parameters()) {
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) s.params.push_back(p);
  }
  PARALLAX_CHECK(!s.params.empty(), UsageError, "every parameter of the model is frozen (requires_grad = false)");
  const std::int64_t bucket_bytes = config.zero.bucket_bytes();
  // bf16 gradients accumulate and are reduced in fp32, straight into the masters' grads.
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
  s.telemetry = std::make_unique<StepTelemetry>(runtime);
  s.loss_sum = torch::zeros({}, torch::kFloat64);
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
  if (s.micro_step == s.grad_accum) s.buckets->arm();
  auto span = tracer().span("backward", "compute");
  s.loss_sum += loss.detach().to(torch::kFloat64);
  (loss / static_cast<double>(s.grad_accum)).backward();
}

bool Engine::step() {
  State& s = *state_;
  if (s.micro_step < s.grad_accum) return false;
  s.buckets->finish();
  s.micro_step = 0;

  const double lr = scheduled_lr(s.spec, s.global_step);
  {
    auto span = tracer().span("optimizer", "compute");
    torch::NoGradGuard no_grad;
    if (s.spec.optimizer.grad_clip > 0) torch::nn::utils::clip_grad_norm_(s.optimized(), s.spec.optimizer.grad_clip);
    set_learning_rate(*s.optimizer, lr);
    s.optimizer->step();
    for (std::size_t i = 0; i < s.masters.size(); ++i) s.params[i].detach().copy_(s.masters[i]);
  }
  s.buckets->zero();
  ++s.global_step;

  const double local_loss = s.loss_sum.item<double>() / static_cast<double>(s.grad_accum);
  s.loss_sum.zero_();
  s.last = s.telemetry->end_window(s.global_step, local_loss, lr, model_state_bytes());
  return true;
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
  return state_->buckets->gradient_bytes();
}
std::int64_t Engine::gradient_padding_bytes() const {
  return state_->buckets->padding_bytes();
}
std::size_t Engine::bucket_count() const {
  return state_->buckets->bucket_count();
}
void Engine::set_tokens_per_sample(std::int64_t tokens) {
  state_->telemetry->set_tokens_per_sample(tokens);
}

std::vector<torch::Tensor> Engine::master_parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : state_->optimized()) out.push_back(p.detach().to(torch::kFloat32));
  return out;
}

ModelStateBytes Engine::model_state_bytes() const {
  const State& s = *state_;
  ModelStateBytes bytes;
  for (const auto& p : s.params) bytes.params += payload_bytes(p);
  bytes.grads = s.buckets->buffer_bytes();
  bytes.optimizer = optimizer_state_bytes(*s.optimizer);
  for (const auto& m : s.masters) bytes.optimizer += payload_bytes(m);  // the fp32 master weight
  return bytes;
}

void Engine::begin_micro_step() {
  state_->telemetry->begin_window_if_needed();
}

torch::Tensor Engine::prepare_input(const torch::Tensor& input) const {
  if (input.is_floating_point() && input.scalar_type() != state_->dtype) return input.to(state_->dtype);
  return input;
}

Tracer& Engine::tracer() {
  return state_->runtime->tracer();
}

}  // namespace parallax
