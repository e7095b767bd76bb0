// The step applier: what both engines own (runtime/engine.h and runtime/pipeline_engine.h)
// to turn a model into one that trains under the plan, and to apply each optimizer step.
// Internal to runtime/.
//
// Construction (collective over the mesh):
//  1. the registered strategy steps the plan asks for, in their order
//     (strategy_steps.h: tensor parallelism, a pipeline stage's coupling, data
//     parallelism), each preparing the model; then the model is cast to the compute
//     dtype;
//  2. each step says how it splits the trained parameters beyond the data-parallel group;
//  3. the GradientReduction (replicated buckets or ZeRO, gradient_reduction.h) over the
//     trainable parameters, told how the model is split beyond the data-parallel group
//     (the norm's groups and weights, partial sequence-parallel gradients);
//  4. the fp16 loss scaler and the step's telemetry.
// Per optimizer step the engine runs its backwards through reduction(), finishes it, and
// calls apply_step(): learning rate, loss scale, the reduction's step (global norm over
// every parallel dimension, each element once, clip, update), telemetry.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/core/cpu_memory_meter.h"
#include "parallax/core/metrics.h"
#include "parallax/core/trace.h"
#include "parallax/runtime/optimizer.h"
#include "parallax/runtime/preemption.h"
#include "parallax/tensor_parallel/parallelize.h"
#include "parallax/zero/parameter_interception.h"

namespace parallax {
namespace checkpoint {
struct SaveResult;
class AsyncSaver;
}  // namespace checkpoint
namespace context_parallel {
class ContextParallel;
}  // namespace context_parallel
namespace expert_parallel {
class MoeLayerImpl;
}  // namespace expert_parallel
namespace zero {
class ShardedModel;
class LossScaler;
}  // namespace zero
class Runtime;
class Communicator;
class GradientReduction;
namespace proto {
class Plan;
}
class StepTelemetry;
class StrategyStep;

/// How a pipeline stage's module couples to the other stages.
struct StageCoupling {
  /// Parameters whose gradient norm another holder counts: every copy of a tied weight
  /// but its first holder's.
  std::vector<torch::Tensor> norm_excluded;
  /// The whole model's path of a module at `path` in the stage's module, for the
  /// [tensor_parallel.plan]'s rules.
  std::function<std::string(const std::string& path)> plan_path;
  /// Tied copies (by TensorImpl) and whether optimizer.no_decay exempts them, as their
  /// first holder's copy is exempt (an LM head tied to the token embedding is an
  /// embedding), so every copy steps alike.
  std::map<const void*, bool> tied_exempt;
};

/// Held around a model's (or a pipeline chunk's) forward: ZeRO-3 gathering on use, and
/// each strategy step's scope (the tensor-parallel rewrite of planned modules), opened
/// in the steps' order and closed in reverse.
struct ModelScope {
  ModelScope(zero::ParameterUseScope gathering, std::vector<std::shared_ptr<void>> steps)
      : gathering(std::move(gathering)), steps(std::move(steps)) {}
  ModelScope(ModelScope&&) = default;
  ModelScope& operator=(ModelScope&&) = delete;
  ~ModelScope() {
    while (!steps.empty()) steps.pop_back();
  }

  zero::ParameterUseScope gathering;
  std::vector<std::shared_ptr<void>> steps;
};

/// A whole model's forward: the step's trace span around the ModelScope.
struct ForwardScope {
  Tracer::Span span;
  ModelScope model;
  MemoryPhase memory{"the forward"};  ///< names it in a MemoryLimitError (memory.limit_mb)
};

class StepApplier {
 public:
  /// Collective; the construction above, as `plan` says (the run's, or an engine's own:
  /// Runtime::engine_plan). `name`: the engine's (EngineOptions), "" for the run's; a
  /// named engine's checkpoints go under checkpoint.dir/<name>. `stage` is null for a
  /// whole model (parallel.pp must then be 1) and the pipeline coupling for one stage's
  /// module. Throws ConfigError for a config it cannot run, UsageError for a model that
  /// differs across ranks or has nothing to train, for a parameter another engine of the
  /// runtime trains, for a second engine of the same name (or a second unnamed one that
  /// would save into the same checkpoint.dir), CommError if a broadcast fails.
  StepApplier(Runtime& runtime,
              const proto::Plan& plan,
              const std::string& name,
              std::shared_ptr<torch::nn::Module> model,
              const OptimizerSpec& spec,
              const StageCoupling* stage);
  ~StepApplier();
  StepApplier(const StepApplier&) = delete;
  StepApplier& operator=(const StepApplier&) = delete;

  /// Every backward runs through it; finish() it at the accumulation boundary.
  GradientReduction& reduction() { return *reduction_; }
  /// Opens the step's timing window (idempotent until apply_step closes it).
  void begin_window();
  /// begin_window(), then the scope a forward runs in. At ZeRO stage 3 a forward under
  /// torch::NoGradGuard (an evaluation) first agrees with every rank of the data-parallel
  /// group on a communicator of its own, since its gathers are collectives: one rank
  /// evaluating alone fails with a CommError naming the evaluation after comm.timeout_s,
  /// instead of its gathers meeting the others' training gathers.
  ForwardScope forward_scope();
  /// The scope alone, for a forward that is part of a step (a pipeline chunk's).
  ModelScope model_scope() const;
  /// The ZeRO-3 parameter scopes of the runtime's other engines, held around a backward
  /// that may run through their models (a generator's loss through the discriminator);
  /// they close in reverse order.
  class PeerScopes {
   public:
    PeerScopes() = default;
    PeerScopes(PeerScopes&&) = default;
    ~PeerScopes() {
      while (!scopes_.empty()) scopes_.pop_back();
    }
    void add(zero::ParameterUseScope scope) {
      scopes_.push_back(std::make_unique<zero::ParameterUseScope>(std::move(scope)));
    }

   private:
    std::vector<std::unique_ptr<zero::ParameterUseScope>> scopes_;
  };
  PeerScopes peer_scopes() const;
  /// Runs `body` (the model's forward or backward) through explain_missing_kernel().
  void run_model(const std::function<void()>& body) const;
  /// Call inside a `catch (const c10::Error&)` around the model's forward or backward:
  /// throws ConfigError when the error in flight is a kernel this LibTorch lacks in the
  /// compute dtype (fp16 matrix products on CPU under LibTorch 1.13), naming
  /// precision.dtype, where it was set, the kernel, and the dtype that runs; returns
  /// otherwise, for the caller to rethrow.
  void explain_missing_kernel() const;
  /// This rank's part of a tensor of its data-parallel micro-batch: each strategy step's
  /// local_part in order (with cp > 1, the sequence split); the tensor itself otherwise.
  torch::Tensor local_part(const torch::Tensor& micro_batch) const;
  /// The context-parallel handle (parallel.cp > 1), else null.
  std::shared_ptr<context_parallel::ContextParallel> context_parallel() const;
  /// Floating-point inputs cast to the compute dtype. Under tensor parallelism the first
  /// call checks that every rank of the group got the same input (UsageError if not).
  torch::Tensor prepare_input(const torch::Tensor& input);
  /// After reduction().finish(): clips, updates and records the step, `local_loss` being
  /// the mean loss of this rank's window. Collective; blocks. Throws UsageError when a
  /// trained parameter no longer requires grad (the plain program's optimizer would
  /// skip it; this step would not).
  void apply_step(double local_loss);

  /// Index of `param` among the trained parameters (the reduction's order). Throws
  /// UsageError for a tensor that is not one.
  std::size_t parameter_index(const torch::Tensor& param) const;
  /// Engine::cross_entropy: vocabulary-parallel on logits a plan left split.
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) const;
  /// The loss multiplier before backward: the fp16 loss scale, else 1.
  double loss_scale() const;
  std::int64_t skipped_steps() const;

  /// What this engine applies.
  const proto::Plan& plan() const { return *plan_; }
  /// The engine's name ("" for the run's), its trained parameters and their names.
  const std::string& name() const { return name_; }
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  std::int64_t global_step() const { return global_step_; }
  const StepMetrics& last_metrics() const { return last_; }
  torch::ScalarType compute_dtype() const { return dtype_; }
  ModelStateBytes model_state_bytes() const;
  std::vector<torch::Tensor> master_parameters() const;
  const zero::ShardedModel* sharded_model() const;
  StepTelemetry& telemetry() { return *telemetry_; }
  Tracer& tracer();

  // ---- checkpoints (step_applier_checkpoint.cpp; the format is checkpoint/store.h) ----
  /// Collective over the world, between optimizer steps: every rank writes the state it
  /// owns (fp32 parameters or masters and optimizer state, named by the whole model's
  /// parameter names; its RNG streams) under checkpoint.dir, rank 0 the engine's scalars
  /// and `trainer_state`. Throws CheckpointError on every rank when one cannot write.
  checkpoint::SaveResult save_checkpoint(const std::string& trainer_state);
  /// Collective over the world: loads the checkpoint at `where` (a checkpoint directory,
  /// or with `latest` the newest complete one under the root `where`) into this engine,
  /// each rank reading only the ranges it holds; returns the trainer state saved with
  /// it. Throws CheckpointError on every rank when a rank finds a file torn or
  /// corrupted, or a tensor missing or of another shape (naming the file or tensor).
  std::string load_checkpoint(const std::string& where, bool latest);
  /// What checkpoint.load names ("latest": the newest complete one under
  /// checkpoint.dir), loaded; nothing when it is "". Collective.
  std::optional<std::string> resume();
  /// After a step: when any rank has received a preemption signal (checkpoint.preemption),
  /// saves and turns preempted() true; otherwise saves when checkpoint.every divides the
  /// step count. Collective (with checkpoint.dir set, one 8-byte all-reduce per step).
  void save_if_due();
  /// Whether a preemption signal made the last step boundary save: the trainer stops.
  bool preempted() const { return preempted_; }
  /// Collective, at the end of training: with checkpoint.dir set, saves the final state
  /// unless the last save holds it, waits for a save in flight, and writes the weights
  /// to checkpoint.export_on_finish when it is set (rank 0, one tensor at a time).
  void finish();
  /// checkpoint.async: waits for the save in flight and returns its result (nothing when
  /// none is); rethrows its CheckpointError. Collective.
  std::optional<checkpoint::SaveResult> wait_for_checkpoint();

 private:
  void log_saved(const checkpoint::SaveResult& result) const;
  /// Collective: whether any rank has received a preemption signal; if one has, saves.
  bool save_if_preempted();

  Runtime* runtime_;
  std::unique_ptr<const proto::Plan> plan_;
  std::string name_;             ///< the engine's, "" for the run's
  std::string checkpoint_root_;  ///< checkpoint.dir, or checkpoint.dir/<name>
  std::shared_ptr<torch::nn::Module> model_;
  OptimizerSpec spec_;
  torch::ScalarType dtype_ = torch::kFloat32;
  torch::Device device_{torch::kCPU};                          ///< the runtime's: the model and every input go there
  std::vector<torch::Tensor> params_;                          ///< the model's trainable ones (compute dtype)
  std::vector<std::string> param_names_;
  std::vector<expert_parallel::MoeLayerImpl*> moe_layers_;  ///< the model's MoE layers (routing metrics)                       ///< theirs, in the whole model
  std::vector<std::unique_ptr<StrategyStep>> steps_;           ///< the registered strategies the plan asks for
  const tensor_parallel::ParallelizedModel* split_ = nullptr;  ///< the tensor-parallel step's (parallel.tp > 1)
  std::unique_ptr<GradientReduction> reduction_;
  std::unique_ptr<Communicator> evaluation_;  ///< zero.stage = 3: agreement before an evaluation forward
  std::unique_ptr<zero::LossScaler> scaler_;  ///< fp16
  std::unique_ptr<StepTelemetry> telemetry_;
  std::unique_ptr<checkpoint::AsyncSaver> saver_;  ///< checkpoint.async, from the first save
  std::unique_ptr<PreemptionSignals> preemption_;  ///< checkpoint.dir and checkpoint.preemption
  bool preempted_ = false;
  std::int64_t last_saved_step_ = -1;
  bool input_checked_ = false;
  std::int64_t global_step_ = 0;
  StepMetrics last_;
};

/// Mean cross-entropy, in fp32, of whole logits [..., V] against targets [...] (int64).
torch::Tensor dense_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace parallax
