// The strategies a StepApplier composes, each a registered step (internal to runtime/).
//
// A step prepares the model for its strategy (collective over the mesh), says how it
// splits the trained parameters beyond the data-parallel group (the global norm's groups
// and weights, partial gradients), and may hold a scope around each forward. The
// registry, strategy_steps(), lists them in composition order, each with the condition
// on the plan under which it applies; the applier runs those that apply, in that order,
// and names none of them. A new strategy is one row there and one class.
//
// The registered steps, in order:
//  1. tensor parallelism (parallel.tp > 1): the model made identical over the tp group,
//     then split by the [tensor_parallel.plan] (a pipeline stage's rules match the whole
//     model's paths, and every rule must match on some stage);
//  2. pipeline stage (a PipelineEngine's stage): the pp group joins the norm, tied copies
//     after their first holder are not counted, and a backward reaches one chunk;
//  3. context parallelism (parallel.cp > 1): each sequence split over the cp group;
//     the batch's sequence dimension is cut by the load-balanced split, and around each
//     forward the handle is current (context_parallel::current()), so the model's
//     attention crosses the group; the parameters are replicated over cp, so the
//     replicas below are dp × cp;
//  4. data parallelism (always): the same structure on every replica (dp × cp ranks),
//     parameters and buffers broadcast from replica 0 (deferred ones materialized, or at
//     ZeRO stage 3 left for sharding unit by unit);
//  5. expert parallelism (always; a no-op without expert_parallel::MoeLayer): each MoE
//     layer counts its load-balancing loss over the replicas, and with parallel.ep > 1
//     keeps this rank's block of experts (every rank holds replica 0's after step 4); the
//     experts' parameters then reduce over the ranks holding the same experts.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "parallax/context_parallel/context_parallel.h"
#include "parallax/runtime/step_applier.h"

namespace parallax {

struct ModelSplit;
namespace proto {
class Plan;
}

/// What the steps read and change while the applier prepares a model.
struct Preparation {
  Runtime& runtime;
  const proto::Plan& plan;
  /// The pipeline coupling of a stage's module; null for a whole model.
  const StageCoupling* stage;
  torch::nn::Module& model;
  /// The model's parameters, each once (a tied weight appears twice in parameters()).
  const std::vector<torch::Tensor>& unique;
  /// The compute dtype the model will be cast to after the steps.
  torch::ScalarType dtype;
};

class StrategyStep {
 public:
  virtual ~StrategyStep() = default;
  /// Collective over the mesh: makes the model this strategy's. Throws ConfigError for a
  /// plan the model does not fit, UsageError for a model that differs across ranks.
  virtual void prepare(Preparation& p) = 0;
  /// Adds this strategy's part to `split` for the trained parameters `trained` (final,
  /// in the reduction's order); `split.norm_weights` holds one weight per parameter,
  /// 1.0 until a step scales it.
  virtual void describe(const std::vector<torch::Tensor>& trained, ModelSplit& split) const {}
  /// The scope held around each forward of the model (or of a pipeline chunk); null when
  /// the strategy needs none.
  virtual std::shared_ptr<void> forward_scope() const { return nullptr; }
  /// The tensor-parallel split, when this step made one: checkpoints name its parts by
  /// it, the loss reads its split vocabulary and the first input is checked over tp.
  virtual const tensor_parallel::ParallelizedModel* tensor_split() const { return nullptr; }
  /// The context-parallel handle, when this step made one (Engine::context_parallel()).
  virtual std::shared_ptr<context_parallel::ContextParallel> context() const { return nullptr; }
  /// This rank's part of a tensor of the data-parallel rank's micro-batch (after its
  /// batch dimension was split): the tensor itself unless the strategy splits it further.
  virtual torch::Tensor local_part(const torch::Tensor& batch) const { return batch; }
};

/// One registered strategy.
struct StepDef {
  const char* name;  ///< "tensor parallelism", for messages
  /// Whether `plan` (and, for a pipeline stage, `stage` non-null) asks for it.
  bool (*applies)(const proto::Plan& plan, const StageCoupling* stage);
  std::unique_ptr<StrategyStep> (*make)();
};

/// The registered strategies, in composition order.
const std::vector<StepDef>& strategy_steps();

}  // namespace parallax
