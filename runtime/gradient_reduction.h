// How the engines reduce and apply gradients: one interface, implemented by replicated
// data parallelism (gradient buckets all-reduced during backward, a LibTorch optimizer
// over whole parameters or their fp32 masters) and by ZeRO (zero::ShardedModel:
// reduce-scatter into owner shards, a sharded or offloaded optimizer). The data-parallel
// engine and the pipeline engine own one each, built from the config by
// make_gradient_reduction(); neither branches on which.
//
// Protocol, per optimizer step (every rank of the data-parallel group runs the same):
//  1. Forward runs inside use_scope() (ZeRO-3 gathers parameters on use).
//  2. Each backward runs through run_backward(writes, backward), told what it writes
//     (pipeline::WeightGradients): kSome for weight gradients, kLast for the window's
//     last such backward as far as the engine knows (the reductions that wait for the
//     window launch during it), kNone for only an input's gradient (zb-h1's first
//     pass). Backwards after a kLast one are allowed (a loss the engine did not foresee).
//     Gradients follow LibTorch's rules throughout (zero/gradient_ledger.h): other
//     backwards' contributions to these parameters stay in .grad until the trainer
//     clears them or a backward here takes them, and the trainer's zero_grad() clears
//     what the reduction holds.
//  3. finish(): what the trainer cleared is dropped, gradients that came after the
//     reductions began are reduced too (one more collective, only then), every
//     reduction is done; partial (sequence-parallel) gradients are summed over the
//     tensor-parallel group.
//  4. Optionally edit_gradients() (the pipeline's tied-weight sum).
//  5. step(): averages, computes the global norm over every parallel dimension (each
//     element once), skips a non-finite step when asked, clips, updates, refreshes the
//     compute-dtype parameters and zeroes the gradients.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/metrics.h"
#include "parallax/pipeline/executor.h"
#include "parallax/runtime/optimizer.h"
#include "parallax/zero/parameter_interception.h"
#include "parallax/zero/sharded_model.h"

namespace torch::nn {
class Module;
}

namespace parallax {

class Runtime;
namespace proto {
class Plan;
}

/// The model's split over ranks beyond the data-parallel group.
struct ModelSplit {
  /// Groups whose ranks hold other parts of the model (tp, pp); empty for plain data
  /// parallelism. The global norm sums over each.
  std::vector<Communicator*> norm_groups;
  /// Per parameter, when norm_groups is not empty: 1 / the ranks holding the same
  /// elements, 0 for a tied copy another stage counts.
  std::vector<double> norm_weights;
  /// The tensor-parallel group, and the parameters (indices) whose gradients are partial
  /// sums over it (sequence parallelism); null and empty otherwise.
  Communicator* tp = nullptr;
  std::vector<std::size_t> partial;
  /// A backward may reach only some parameters (a pipeline chunk's): ZeRO 2–3 then
  /// reduce only the groups it reached. Every rank of dp runs the same backwards.
  bool partial_backwards = false;
  /// Expert parallelism: the experts' parameters this rank holds (indices, in
  /// `expert.members`) reduce, and are sharded, over `expert.comm` (the ranks holding
  /// the same experts) instead of the data-parallel group, averaged by the data-parallel
  /// group's size all the same; `experts` is the ep group, whose ranks hold the other
  /// experts (the norm sums over it). Empty and null otherwise.
  zero::OtherReductionGroup expert;
  Communicator* experts = nullptr;
};

/// A run of one trained parameter's fp32 state on this rank: elements [offset, offset +
/// n) of params[param] flattened, as the tensor the optimizer steps ("param": the fp32
/// master, or the parameter itself under fp32) and as each of the optimizer's state
/// tensors for it (optimizer_state's names), every one a 1-D view of n elements.
struct StateSlice {
  std::size_t param = 0;
  std::int64_t offset = 0;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  /// The optimizer's step count for the parameter's part here (LibTorch keeps one per
  /// parameter, and a step that skips a parameter without a gradient does not count
  /// it); 0: never stepped.
  std::int64_t steps = 0;
  /// Sets that count (a checkpoint's).
  std::function<void(std::int64_t)> set_steps;
};

/// Which slices state_slices() returns.
enum class StateAccess {
  kOwned,  ///< what this rank writes to a checkpoint: each element on one rank of dp
  kHeld,   ///< everything this rank holds: what a checkpoint load fills
};

class GradientReduction {
 public:
  virtual ~GradientReduction() = default;

  /// Held around forward (and by run_backward around backward).
  virtual zero::ParameterUseScope use_scope() const = 0;
  /// Runs `backward` (which calls autograd), reducing over the data-parallel group as the
  /// strategy does. Blocks until this backward's reductions are done where the strategy
  /// waits per backward (ZeRO); throws CommError.
  virtual void run_backward(pipeline::WeightGradients writes, const std::function<void()>& backward) = 0;
  /// A micro-batch ended before the window's last (Engine::step() before the boundary):
  /// its gradients are the window's, beyond the trainer's zero_grad(), as the plain
  /// loop's optimizer step would have consumed them. Does not communicate.
  virtual void end_micro_batch() = 0;
  /// Step 3 of the protocol. Blocks; throws CommError.
  virtual void finish() = 0;
  /// Calls `edit` with the reduced, not yet averaged fp32 gradients of params[i] for i in
  /// `indices`, each whole (the parameter's shape); what `edit` writes into them is what
  /// step() uses. Under ZeRO a collective over the data-parallel group.
  virtual void edit_gradients(const std::vector<std::size_t>& indices,
                              const std::function<void(std::vector<torch::Tensor>&)>& edit) = 0;
  /// Step 5 with learning rate `lr`; `loss_scale` is undone (fp16), `clip` is the norm
  /// bound (0 = off), and with `skip_non_finite` a non-finite norm skips the update.
  /// Collective; blocks.
  virtual zero::StepOutcome step(double lr, double loss_scale, double clip, bool skip_non_finite) = 0;

  /// Parameters in fp32, as the optimizer sees them. Under ZeRO a collective over dp.
  virtual std::vector<torch::Tensor> master_parameters() = 0;
  virtual ModelStateBytes model_state_bytes() const = 0;
  /// Gradient payload reduced per step, and padding (bytes); buckets or flat groups.
  virtual std::int64_t gradient_bytes() const = 0;
  virtual std::int64_t gradient_padding_bytes() const = 0;
  /// Of those, the experts' (ModelSplit::expert): reduced over their own group.
  virtual std::int64_t expert_gradient_bytes() const = 0;
  virtual std::int64_t expert_gradient_padding_bytes() const = 0;
  virtual std::size_t bucket_count() const = 0;
  /// The ZeRO state; null for replicated data parallelism.
  virtual const zero::ShardedModel* sharded_model() const { return nullptr; }
  /// Windows whose late gradients (step 3) took one more reduction, since construction.
  virtual std::int64_t late_reductions() const = 0;
  /// The trainer's own optimizer holds `sentinel` (runtime/trainer_optimizer.h): its
  /// zero_grad() clears these parameters' gradients, as it would in LibTorch.
  virtual void watch_zero_grad(torch::Tensor sentinel) = 0;

  /// The parameters' fp32 state, sliced as `access` says (replicated data parallelism
  /// owns an even split of the concatenated parameters per rank of dp; ZeRO its shards).
  /// With `create_optimizer_state`, state the optimizer has not made yet (before its
  /// first step) is created, zeroed, so a load can fill it. Throws UsageError for an
  /// offloaded optimizer, whose state this build does not checkpoint.
  virtual std::vector<StateSlice> state_slices(StateAccess access, bool create_optimizer_state) = 0;
  /// After a load wrote into state_slices(kHeld, true): the compute-dtype parameters
  /// are refreshed from it. Collective over dp under ZeRO.
  virtual void state_loaded() = 0;
  /// The optimizer's step count (Adam's bias correction): the most of any parameter's
  /// on this rank (StateSlice::steps); 0 before its first step.
  virtual std::int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(std::int64_t steps) = 0;
};

/// Replicated data parallelism at zero.stage = 0, ZeRO (with [offload]) at 1–3, as the
/// engine's `plan` says, over `params` (the model's trainable parameters, in the compute
/// dtype `dtype`) and runtime.mesh().replicas() (the data-parallel group, times cp), with
/// the optimizer's parameter groups `optimizer` (optimizer.of[i]: params[i]'s group).
/// Throws ConfigError for an option ZeRO cannot take.
std::unique_ptr<GradientReduction> make_gradient_reduction(Runtime& runtime,
                                                           const proto::Plan& plan,
                                                           torch::nn::Module& model,
                                                           std::vector<torch::Tensor> params,
                                                           torch::ScalarType dtype,
                                                           const OptimizerGroups& optimizer,
                                                           ModelSplit split);

}  // namespace parallax
