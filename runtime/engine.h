// The training engine: what a trainer calls around its existing loop.
//
//   auto engine = rt.engine(model, optimizer);   // or an OptimizerSpec from [optimizer]
//   for (int64_t i = 0; i < steps * grad_accum; ++i) {
//     auto [input, target] = engine.local_batch(load_batch(i));   // this rank's part
//     optimizer.zero_grad();   // optional, as in plain LibTorch
//     auto loss = loss_fn(engine.forward(input), target);
//     engine.backward(loss);   // (loss / grad_accum).backward(); may be called several times
//     engine.step();           // ends the micro-batch; steps at the accumulation boundary
//   }
//
// Gradients follow LibTorch's rules (zero/gradient_ledger.h). Each micro-batch is one
// iteration of the plain loop: any number of backward() calls accumulate (several
// losses), and step() ends it; train.grad_accum micro-batches make an optimizer step,
// whose gradients the step consumes (the engine starts the next from zero). A backward
// that another engine or plain LibTorch runs through this model leaves its gradients on
// these parameters' .grad, and the trainer's zero_grad() (the module's, or the
// optimizer's handed to the engine) clears them and whatever this engine took of the
// micro-batch's gradients, at every ZeRO stage and with offload; what the step includes
// is what .grad would hold in the plain program. Under ZeRO (and data parallelism
// after the reduction began) .grad shows zeros where the engine holds the gradient.
//
// Data parallelism (this strategy): at construction, rank 0's parameters and
// buffers are broadcast over the data-parallel group; gradients are all-reduced in
// buckets launched from gradient-accumulator hooks during the last micro-step's
// backward (see gradient_buckets.h); step() averages, clips by global norm, runs the
// optimizer with the scheduled learning rate and records metrics.
//
// bf16 (`precision.dtype = "bf16"`): the model's parameters are cast to bf16 for
// compute and communication; fp32 master weights and the optimizer state live beside
// them; after each step the masters are copied back into the bf16 parameters.
// Each backward's bf16 gradients are folded into fp32 buckets, so micro-steps
// accumulate and the all-reduce runs in fp32 (twice the bytes of a bf16 reduction,
// without its rounding); the fp32 masters' gradients are views into those buckets.
//
// fp16 (`precision.dtype = "fp16"`): as bf16, with the loss multiplied by a dynamic
// scale before backward (zero/loss_scaler.h); a step whose gradients overflow is
// skipped on every rank and logged.
//
// ZeRO (`zero.stage` 1–3, see zero/sharded_model.h): the parameters move into flat
// buffers sharded over the data-parallel group; the optimizer sees only this rank's
// fp32 master shard. At stage 3 parameters exist only while a unit is in use: between
// steps read them through master_parameters(), not through the model.
//
// Tensor parallelism (`parallel.tp` > 1, see tensor_parallel/parallelize.h): at
// construction the model is split over the tensor-parallel group, by the
// [tensor_parallel.plan] or as written with tensor_parallel/ layers; forward() runs the
// split model. Every rank of a tensor-parallel group must get the same micro-batch
// (index data by mesh().coord().dp; the first forward checks). The gradient-clipping
// norm sums the split parameters over the group and counts replicated ones once; with
// sequence parallelism the replicated parameters' partial gradients are summed over
// the group before the step. A `vocab_output` plan leaves the logits split over the
// vocabulary: compute the loss with cross_entropy(), which works with or without a plan.
//
// Pipeline parallelism (`parallel.pp` > 1) takes the model as layer specs: see
// PipelineEngine (pipeline_engine.h), whose train_batch() replaces
// forward/backward/step. Both engines own a StepApplier (step_applier.h), which
// prepares the model (tensor-parallel split, broadcast, cast) and applies each step;
// this one adds the trainer-driven micro-step window.
//
// Several engines in one program (a GAN's generator and discriminator) each take their
// own options from an [engine.<name>] table (EngineOptions); a backward through another
// engine's ZeRO-3 model gathers its parameters too.
#pragma once

#include <torch/data/example.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "parallax/checkpoint/store.h"
#include "parallax/core/metrics.h"
#include "parallax/runtime/optimizer.h"
#include "parallax/runtime/runtime.h"
#include "parallax/runtime/step_applier.h"
#include "parallax/runtime/trainer_optimizer.h"

namespace parallax {
namespace context_parallel {
class ContextParallel;
}  // namespace context_parallel

class Engine {
 public:
  /// Collective over the mesh: checks that every rank built the same model, broadcasts
  /// parameters and buffers from data-parallel rank 0, casts to the compute dtype,
  /// builds buckets and the optimizer over the trainable parameters (a weight shared by
  /// several modules counts once; frozen ones are broadcast but not trained). Buffers
  /// are broadcast once, here: buffers the forward updates (BatchNorm statistics) then
  /// evolve per rank. Throws ConfigError for a config it cannot run, UsageError for a
  /// model that differs across ranks or has nothing to train, CommError if the
  /// broadcast fails.
  /// With options.name, the engine's [engine.<name>] table applies (Runtime::engine_plan),
  /// and rank 0 prints what it changed.
  Engine(Runtime& runtime,
         std::shared_ptr<torch::nn::Module> model,
         const OptimizerSpec& spec,
         const EngineOptions& options = {});
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  /// This rank's part of a batch that every data-parallel rank loaded whole (the same
  /// samples on every rank): rows [r n / dp, (r + 1) n / dp) of the leading dimension n,
  /// r = this rank's data-parallel coordinate (the ranks of a tensor-parallel group get
  /// the same part). A batch of dp x train.micro_batch_size samples gives each rank its
  /// micro-batch, so the run computes what one process computes on the whole batch.
  /// With parallel.cp > 1, also this rank's part of the sequence (local_sequence).
  /// Overloads take a std::pair of tensors and a torch::data::Example. Pure, no
  /// communication; throws UsageError when n is not a multiple of dp.
  torch::Tensor local_batch(const torch::Tensor& batch) const;
  /// This rank's part of a tensor of its own micro-batch ([micro_batch, seq, ...]): with
  /// parallel.cp > 1 the positions of context_parallel.sequence_dim this rank of the cp
  /// group holds (load-balanced: chunks r and 2cp − 1 − r of 2cp), the tensor itself
  /// otherwise. For inputs and targets alike. Pure; throws ConfigError when 2·cp does not
  /// divide the sequence.
  torch::Tensor local_sequence(const torch::Tensor& micro_batch) const;
  /// With parallel.cp > 1, what the model's layers call to run over the context-parallel
  /// group (its positions and attention: context_parallel/context_parallel.h), current on
  /// this thread during every forward the engine runs (context_parallel::current()); null
  /// otherwise. Shared with the engine, which keeps the group alive; its counters say
  /// what attention moved and computed.
  std::shared_ptr<context_parallel::ContextParallel> context_parallel() const;
  template <typename First, typename Second>
  std::pair<First, Second> local_batch(const std::pair<First, Second>& batch) const {
    return {local_batch(batch.first), local_batch(batch.second)};
  }
  template <typename Data, typename Target>
  torch::data::Example<Data, Target> local_batch(const torch::data::Example<Data, Target>& batch) const {
    return {local_batch(batch.data), local_batch(batch.target)};
  }

  /// Backward of `loss / grad_accum`; any number per micro-batch, their gradients
  /// accumulating. In the window's last micro-batch the reductions launch while the
  /// backward runs that ends as many backwards as the previous micro-batch ran; a later
  /// one takes one more reduction at the step (late_reductions()). `loss` must be a
  /// scalar of this rank's micro-batch mean.
  void backward(const torch::Tensor& loss);

  /// Ends a micro-batch. At the accumulation boundary (train.grad_accum micro-batches):
  /// drops what the trainer cleared, reduces what arrived late, waits for the
  /// reductions, clips, updates, advances the schedule, writes metrics and the progress
  /// line, zeroes gradients; returns true. Before the boundary: the micro-batch's
  /// gradients join the step's (beyond the trainer's zero_grad()) and it returns false.
  /// Blocks; throws CommError if a collective fails or times out.
  bool step();

  /// Mean cross-entropy of `logits` [..., V] against `targets` [...] (int64), in fp32.
  /// When a plan's `vocab_output` layer leaves the logits split over the vocabulary,
  /// `logits` is this rank's part and the loss is computed vocab-parallel, never
  /// gathering them (collective over the tensor-parallel group); otherwise it is the
  /// dense loss. (A model written with a vocabulary-split head of its own calls
  /// tensor_parallel::vocab_parallel_cross_entropy itself.) `targets` may sit on the
  /// host: they are moved to the logits' device.
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) const;

  /// Collective over the world, between optimizer steps: saves a checkpoint of the
  /// training state after the last step under checkpoint.dir (a named engine's under
  /// checkpoint.dir/<name>, its export_on_finish file as <stem>.<name>.<ext>; each rank writes what it
  /// owns; published atomically; the oldest beyond checkpoint.keep go; see
  /// checkpoint/store.h). `trainer_state`: bytes resume() gives back (e.g. a data
  /// loader's position). With checkpoint.every = N, step() saves after every N-th step
  /// by itself, with no trainer state. Throws CheckpointError on every rank when one
  /// cannot write; the previous checkpoints stay intact. With checkpoint.async, returns
  /// once the state is copied to host memory; a thread writes it while training goes on
  /// (the next save, a load, wait_for_checkpoint() and the engine's end wait for it, and
  /// the first of them rethrows its error).
  checkpoint::SaveResult save_checkpoint(const std::string& trainer_state = "");
  /// checkpoint.async: waits for the save in flight; returns its result, or nothing.
  std::optional<checkpoint::SaveResult> wait_for_checkpoint();
  /// Collective, before the first forward: loads what checkpoint.load names ("latest":
  /// the newest complete checkpoint under checkpoint.dir; a .safetensors file: weights
  /// only, the optimizer starting afresh; else a checkpoint directory)
  /// and returns the trainer state saved with it; training goes on from global_step().
  /// Loads nothing and returns nothing when checkpoint.load is "". Throws
  /// CheckpointError naming the file for a torn or corrupted checkpoint.
  std::optional<std::string> resume();
  /// Collective: loads the checkpoint directory `directory` (or the weights in a
  /// .safetensors file); returns its trainer state.
  std::string load_checkpoint(const std::string& directory);
  /// Whether a preemption signal (SIGTERM or SIGUSR1 to any rank; checkpoint.preemption)
  /// made the last step save: the trainer should stop, call finish() and exit 0.
  bool preempted() const;
  /// Collective, once training is over: with checkpoint.dir set, saves the final state
  /// unless the last save holds it, waits for a save in flight, and writes the weights
  /// to checkpoint.export_on_finish when set. Throws CheckpointError on every rank when
  /// one fails.
  void finish();

  /// Completed optimizer steps.
  std::int64_t global_step() const;
  /// Micro-steps per optimizer step.
  std::int64_t grad_accum() const;
  /// Loss of the last optimizer step: the mean over the global batch.
  double last_loss() const;
  /// Learning rate used by the last optimizer step.
  double last_lr() const;
  /// Metrics of the last optimizer step (loss, lr, timings, per-rank bytes and comm).
  const StepMetrics& last_metrics() const;
  /// Dtype the model computes in (float32, bfloat16 or float16).
  torch::ScalarType compute_dtype() const;
  /// Model-state bytes this rank holds now.
  ModelStateBytes model_state_bytes() const;
  /// Gradient payload bytes all-reduced per optimizer step, and bucket padding.
  std::int64_t gradient_bytes() const;
  std::int64_t gradient_padding_bytes() const;
  /// Of those, the bytes of the experts this rank holds (parallel.ep: they reduce over
  /// the ranks holding the same experts), and their padding.
  std::int64_t expert_gradient_bytes() const;
  std::int64_t expert_gradient_padding_bytes() const;
  std::size_t bucket_count() const;
  /// Windows whose gradients partly came after the reduction began (a backward beyond
  /// the ones the engine foresaw, or another model's backward through this one before
  /// the step) and took one more reduction, since construction.
  std::int64_t late_reductions() const;
  /// Tokens in one sample (e.g. a sequence length): the progress line then shows tok/s and
  /// the metrics perf/tokens_per_s. Unset: samples/s (and tokens_per_s = samples per second).
  void set_tokens_per_sample(std::int64_t tokens);
  /// Parameters in fp32, as the optimizer sees them (the masters under bf16/fp16).
  /// Under ZeRO this gathers the shards: a collective over the data-parallel group.
  std::vector<torch::Tensor> master_parameters() const;
  /// The ZeRO state at stages 1–3 (groups, padding, stage-3 gathering); null at stage 0.
  const zero::ShardedModel* sharded_model() const;
  /// fp16: the current loss scale and the steps skipped for overflow (1 and 0 otherwise).
  double loss_scale() const;
  std::int64_t skipped_steps() const;

  /// Held around the model's forward (forward() does): opens the step's timing window,
  /// gathers ZeRO-3 parameters on use and lets planned tensor-parallel modules
  /// communicate. For a trainer that calls its model itself.
  ForwardScope forward_scope();
  /// With parallel.cp > 1, the context-parallel attention calls this rank made so far
  /// (explicit or intercepted scaled_dot_product_attention); 0 otherwise.
  std::int64_t context_attention_calls() const;
  /// After a whole model's forward (forward() calls it): with parallel.cp > 1, throws
  /// UsageError when the forward made no context-parallel attention call since `before`,
  /// for its attention then saw this rank's part of each sequence only and would train
  /// silently wrong.
  void check_context_attention_ran(std::int64_t before) const;
  /// Inside a `catch (const c10::Error&)` around the model's forward: a kernel missing in
  /// the compute dtype becomes a ConfigError naming precision.dtype (StepApplier's).
  void explain_missing_kernel() const;
  /// Floating-point inputs cast to the compute dtype (the first call under tensor
  /// parallelism checks that the group got the same input).
  torch::Tensor prepare_input(const torch::Tensor& input);
  /// forward() calls it with the first tensor argument: the first time its leading
  /// dimension is not train.micro_batch_size, warns (once, on this rank) that the step
  /// averages other batches than the config says, and how to fix it.
  void check_micro_batch(const torch::Tensor& input);

 private:
  std::unique_ptr<StepApplier> applier_;
  const Logger* logger_;
  int dp_rank_ = 0;
  int dp_size_ = 1;
  std::int64_t micro_batch_size_ = 0;
  bool micro_batch_warned_ = false;
  std::int64_t grad_accum_ = 1;
  std::int64_t micro_batches_ = 0;              ///< step() calls in the current window
  std::int64_t backwards_in_micro_batch_ = 0;   ///< backward() calls since the last step()
  std::int64_t backwards_per_micro_batch_ = 1;  ///< in the last micro-batch that had any
  bool several_backwards_said_ = false;
  torch::Tensor loss_sum_;  ///< sum of the window's losses (float64)
};

/// Engine that also knows the module's type, so forward() calls the model's own
/// forward with inputs cast to the compute dtype.
template <typename ModuleImpl>
class ModuleEngine : public Engine {
 public:
  ModuleEngine(Runtime& runtime,
               std::shared_ptr<ModuleImpl> model,
               const OptimizerSpec& spec,
               const EngineOptions& options = {})
      : Engine(runtime, model, spec, options), model_(std::move(model)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    check_first_tensor(args...);
    ForwardScope scope = forward_scope();
    const std::int64_t attended = context_attention_calls();
    try {
      auto output = model_->forward(cast(std::forward<Args>(args))...);
      check_context_attention_ran(attended);
      return output;
    } catch (const c10::Error&) {
      explain_missing_kernel();
      throw;
    }
  }

  ModuleImpl& module() { return *model_; }
  const std::shared_ptr<ModuleImpl>& module_ptr() const { return model_; }

 private:
  template <typename First, typename... Rest>
  void check_first_tensor(const First& first, const Rest&... rest) {
    if constexpr (std::is_same_v<std::decay_t<First>, torch::Tensor>) {
      check_micro_batch(first);
    } else {
      check_first_tensor(rest...);
    }
  }
  void check_first_tensor() {}

  template <typename T>
  decltype(auto) cast(T&& value) {
    if constexpr (std::is_same_v<std::decay_t<T>, torch::Tensor>) {
      return prepare_input(value);
    } else {
      return std::forward<T>(value);
    }
  }

  std::shared_ptr<ModuleImpl> model_;
};

namespace detail {
// The module a trainer passes to Runtime::engine, as the shared_ptr ModuleEngine keeps.
template <typename ModuleImpl>
std::shared_ptr<ModuleImpl> module_pointer(const std::shared_ptr<ModuleImpl>& model) {
  return model;
}
template <typename Holder, typename = typename Holder::ContainedType>
auto module_pointer(Holder& model) {
  return model.ptr();
}
// Held by value: a pointer that owns nothing (the trainer's object must outlive the engine).
template <typename ModuleImpl, std::enable_if_t<std::is_base_of_v<torch::nn::Module, ModuleImpl>, int> = 0>
std::shared_ptr<ModuleImpl> module_pointer(ModuleImpl& model) {
  return std::shared_ptr<ModuleImpl>(std::shared_ptr<ModuleImpl>(), &model);
}
}  // namespace detail

template <typename Model>
auto Runtime::engine(Model&& model, const OptimizerSpec& spec, const EngineOptions& options) {
  static_assert(
      !std::is_base_of_v<torch::nn::Module, std::remove_reference_t<Model>> || std::is_lvalue_reference_v<Model>,
      "rt.engine(module, ...): the engine refers to a module held by value, so pass a variable, not a "
      "temporary");
  auto pointer = detail::module_pointer(model);
  using ModuleImpl = typename decltype(pointer)::element_type;
  return ModuleEngine<ModuleImpl>(*this, std::move(pointer), spec, options);
}

template <typename Model>
auto Runtime::engine(Model&& model, torch::optim::Optimizer& optimizer, const EngineOptions& options) {
  const OptimizerSpec spec = adopt_trainer_optimizer(*this, *detail::module_pointer(model), optimizer);
  return engine(std::forward<Model>(model), spec, options);
}

}  // namespace parallax
