#include "parallax/runtime/engine.h"

#include <torch/version.h>

#include <sstream>

#include "parallax/checkpoint/store.h"
#include "parallax/context_parallel/context_parallel.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/expert_parallel/moe_layer.h"
#include "parallax/runtime/gradient_reduction.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/step_telemetry.h"
#include "proto/plan.pb.h"

namespace parallax {

namespace {

// "# engine 'generator': ZeRO stage 3, offload optimizer none / param none, fp32, 2 micro-batches
// per step (global batch 64); from [engine.generator]: zero.stage = 3 at gan.toml:9:9, ..."
std::string describe_engine(const Runtime& runtime, const std::string& name, const proto::Plan& plan) {
  const Config strategy = recorded_strategy(plan);
  std::ostringstream text;
  text << "# engine '" << name << "': ZeRO stage " << strategy.zero.stage << ", offload optimizer "
       << to_string(strategy.offload.optimizer) << " / param " << to_string(strategy.offload.param) << ", "
       << to_string(strategy.precision.dtype) << ", " << strategy.train.grad_accum
       << " micro-batch(es) per step (global batch " << strategy.train.global_batch_size << ")";
  const auto table = runtime.config().engines.find(name);
  if (table == runtime.config().engines.end())
    return text.str() + "; the run's options (no [engine." + name + "] table)";
  text << "; from [engine." << name << "]:";
  const Config& config = *table->second.config;
  for (const std::string& key : table->second.keys) text << " " << key << config.position_of(key) << ";";
  return text.str();
}

}  // namespace

Engine::Engine(Runtime& runtime,
               std::shared_ptr<torch::nn::Module> model,
               const OptimizerSpec& spec,
               const EngineOptions& options)
    : applier_(std::make_unique<StepApplier>(
          runtime, runtime.engine_plan(options.name), options.name, std::move(model), spec, nullptr)),
      logger_(&runtime.logger()),
      dp_rank_(runtime.mesh().coord().dp),
      dp_size_(runtime.mesh().degrees().dp),
      loss_sum_(torch::zeros({}, torch::kFloat64)) {
  const TrainOptions batch = batch_options(applier_->plan());
  micro_batch_size_ = batch.micro_batch_size;
  grad_accum_ = batch.grad_accum;
  if (!options.name.empty()) logger_->summary(describe_engine(runtime, options.name, applier_->plan()));
}

Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

torch::Tensor Engine::local_batch(const torch::Tensor& batch) const {
  PARALLAX_CHECK(batch.dim() >= 1, UsageError, "local_batch: expected a batch with a leading dimension, got shape ",
                 batch.sizes());
  const std::int64_t n = batch.size(0);
  PARALLAX_CHECK(n % dp_size_ == 0, UsageError, "local_batch: a batch of ", n, " samples does not divide over the ",
                 dp_size_, " data-parallel ranks; load dp x train.micro_batch_size = ", dp_size_ * micro_batch_size_,
                 " samples");
  const std::int64_t part = n / dp_size_;
  return applier_->local_part(batch.narrow(0, dp_rank_ * part, part));
}

torch::Tensor Engine::local_sequence(const torch::Tensor& micro_batch) const {
  return applier_->local_part(micro_batch);
}

std::shared_ptr<context_parallel::ContextParallel> Engine::context_parallel() const {
  return applier_->context_parallel();
}

void Engine::check_micro_batch(const torch::Tensor& input) {
  if (micro_batch_warned_ || input.dim() == 0 || input.size(0) == micro_batch_size_) return;
  micro_batch_warned_ = true;
  logger_->warn("forward got a micro-batch of ", input.size(0), " samples (input shape ", input.sizes(),
                "), but train.micro_batch_size = ", micro_batch_size_, " (global batch ", micro_batch_size_, " x ",
                grad_accum_, " micro-steps x ", dp_size_,
                " data-parallel ranks): each step then averages other batches than the config says. Feed each rank "
                "its part of the global batch (engine.local_batch(batch)) or set train.micro_batch_size to what the "
                "loader gives. (Said once.)");
}

void Engine::backward(const torch::Tensor& loss) {
  PARALLAX_CHECK(loss.dim() == 0, UsageError, "backward: loss must be a scalar, got shape ", loss.sizes());
  const MemoryPhase phase("the backward");
  applier_->begin_window();
  ++backwards_in_micro_batch_;
  // The window's reducing backward, as far as the engine can know: in its last
  // micro-batch, the one that ends as many backwards as the previous micro-batch ran.
  // A backward after it is reduced at the step (the reduction's late gradients).
  const bool last = micro_batches_ + 1 == grad_accum_ && backwards_in_micro_batch_ >= backwards_per_micro_batch_;
  auto span = applier_->tracer().span("backward", "compute");
  if (loss_sum_.device() != loss.device()) loss_sum_ = torch::zeros({}, loss.options().dtype(torch::kFloat64));
  loss_sum_ += loss.detach().to(torch::kFloat64);
  const double scale = applier_->loss_scale() / static_cast<double>(grad_accum_);
  // The loss may run through another engine's model (a generator's loss through the
  // discriminator): its ZeRO-3 parameters are gathered on use too.
  const StepApplier::PeerScopes peers = applier_->peer_scopes();
  // A mixture-of-experts layer's auxiliary loss joins this backward with the loss's weight.
  const expert_parallel::AuxLossGradientScale aux_scale(scale);
  applier_->reduction().run_backward(last ? pipeline::WeightGradients::kLast : pipeline::WeightGradients::kSome,
                                     [&] { applier_->run_model([&] { (loss * scale).backward(); }); });
}

bool Engine::step() {
  const MemoryPhase phase("the optimizer step");
  if (backwards_in_micro_batch_ > 1 && grad_accum_ > 1 && !several_backwards_said_) {
    several_backwards_said_ = true;
    logger_->summary("note: a micro-batch ran ", backwards_in_micro_batch_,
                     " backward calls before step(); they accumulate as one micro-batch (several losses). Each "
                     "step() call ends a micro-batch, and train.grad_accum = ",
                     grad_accum_, " of them make an optimizer step. (Said once.)");
  }
  if (backwards_in_micro_batch_ > 0) backwards_per_micro_batch_ = backwards_in_micro_batch_;
  backwards_in_micro_batch_ = 0;
  if (++micro_batches_ < grad_accum_) {
    applier_->reduction().end_micro_batch();
    return false;
  }
  micro_batches_ = 0;
  applier_->reduction().finish();
  const double local_loss = loss_sum_.item<double>() / static_cast<double>(grad_accum_);
  loss_sum_.zero_();
  applier_->apply_step(local_loss);
  applier_->save_if_due();
  return true;
}

checkpoint::SaveResult Engine::save_checkpoint(const std::string& trainer_state) {
  PARALLAX_CHECK(micro_batches_ == 0 && backwards_in_micro_batch_ == 0, UsageError,
                 "save_checkpoint: inside an accumulation window (", micro_batches_, " of ", grad_accum_,
                 " micro-batches done); save after step() returned true");
  return applier_->save_checkpoint(trainer_state);
}

std::optional<checkpoint::SaveResult> Engine::wait_for_checkpoint() {
  return applier_->wait_for_checkpoint();
}

bool Engine::preempted() const {
  return applier_->preempted();
}

void Engine::finish() {
  PARALLAX_CHECK(micro_batches_ == 0 && backwards_in_micro_batch_ == 0, UsageError,
                 "finish: inside an accumulation window (", micro_batches_, " of ", grad_accum_,
                 " micro-batches done)");
  applier_->finish();
}

std::optional<std::string> Engine::resume() {
  PARALLAX_CHECK(micro_batches_ == 0 && backwards_in_micro_batch_ == 0, UsageError,
                 "resume: inside an accumulation window");
  return applier_->resume();
}

std::string Engine::load_checkpoint(const std::string& directory) {
  PARALLAX_CHECK(micro_batches_ == 0 && backwards_in_micro_batch_ == 0, UsageError,
                 "load_checkpoint: inside an accumulation window");
  return applier_->load_checkpoint(directory, /*latest=*/false);
}

ForwardScope Engine::forward_scope() {
  return applier_->forward_scope();
}
std::int64_t Engine::context_attention_calls() const {
  const auto context = context_parallel();
  return context ? context->counters().calls : 0;
}
void Engine::check_context_attention_ran(std::int64_t before) const {
  const auto context = context_parallel();
  if (!context) return;
  PARALLAX_CHECK(context->counters().calls > before, UsageError, "parallel.cp = ", context->size(),
                 " gives each rank part of every sequence, but the model's forward made no context-parallel "
                 "attention call: its attention saw this rank's positions only, and training would be silently "
                 "wrong. Call parallax::context_parallel::current()->attention(q, k, v) in the model",
                 TORCH_VERSION_MAJOR >= 2 ? ", or torch::scaled_dot_product_attention (the engine runs it over the "
                                            "cp group)"
                                          : " (LibTorch 2.x would also intercept scaled_dot_product_attention)",
                 ", or set parallel.cp = 1");
}
void Engine::explain_missing_kernel() const {
  applier_->explain_missing_kernel();
}
torch::Tensor Engine::prepare_input(const torch::Tensor& input) {
  return applier_->prepare_input(input);
}
torch::Tensor Engine::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) const {
  return applier_->cross_entropy(logits, targets);
}
std::int64_t Engine::global_step() const {
  return applier_->global_step();
}
std::int64_t Engine::grad_accum() const {
  return grad_accum_;
}
double Engine::last_loss() const {
  return applier_->last_metrics().loss;
}
double Engine::last_lr() const {
  return applier_->last_metrics().lr;
}
const StepMetrics& Engine::last_metrics() const {
  return applier_->last_metrics();
}
torch::ScalarType Engine::compute_dtype() const {
  return applier_->compute_dtype();
}
ModelStateBytes Engine::model_state_bytes() const {
  return applier_->model_state_bytes();
}
std::int64_t Engine::gradient_bytes() const {
  return applier_->reduction().gradient_bytes();
}
std::int64_t Engine::gradient_padding_bytes() const {
  return applier_->reduction().gradient_padding_bytes();
}
std::int64_t Engine::expert_gradient_bytes() const {
  return applier_->reduction().expert_gradient_bytes();
}
std::int64_t Engine::expert_gradient_padding_bytes() const {
  return applier_->reduction().expert_gradient_padding_bytes();
}
std::size_t Engine::bucket_count() const {
  return applier_->reduction().bucket_count();
}
std::int64_t Engine::late_reductions() const {
  return applier_->reduction().late_reductions();
}
void Engine::set_tokens_per_sample(std::int64_t tokens) {
  applier_->telemetry().set_tokens_per_sample(tokens);
}
std::vector<torch::Tensor> Engine::master_parameters() const {
  return applier_->master_parameters();
}
const zero::ShardedModel* Engine::sharded_model() const {
  return applier_->sharded_model();
}
double Engine::loss_scale() const {
  return applier_->loss_scale();
}
std::int64_t Engine::skipped_steps() const {
  return applier_->skipped_steps();
}

}  // namespace parallax
