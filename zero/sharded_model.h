// ZeRO stages 1–3 over a model's trainable parameters: flat sharded buffers, the
// gradient reductions into owner shards, stage 3's gather and release, and the
// sharded optimizer step. The engine (runtime/) drives it around the user's loop.
//
// Protocol (every rank of the data-parallel group runs the same steps):
//  1. Construction: the parameters (identical on all ranks, already in the compute
//     dtype) are placed in flat groups — buckets of `bucket_bytes` at stages 1–2; at
//     stage 3 one group per unit (modules selected by `wrap`/`wrap_min_params`, the
//     rest in a root unit) plus replicated buckets for parameters of at most
//     `persistence_threshold` elements. The optimizer is built over the groups' fp32
//     master shards only. Stage 3 then keeps just this rank's shards.
//  2. Forward (stage 3): the engine opens a ParameterUseScope; the first operator to
//     use a unit's parameter gathers the unit (all_gather), prefetching and releasing
//     per GatherSchedule. Between steps a released parameter holds no data: the thread
//     that constructed the model is watched (parameter_interception.h), and an operator
//     there that reads one throws UsageError naming it (read gather_masters(), a
//     collective, instead). On other threads nothing is watched outside a scope. The
//     model may be destroyed on any thread.
//  3. begin_backward(last): stage 3's forward is over (reshard). Backward runs; as each
//     parameter's gradient is accumulated its hook adds it (fp32) to its group's full
//     gradient buffer, and .grad shows the gradient ledger's marker (gradient_ledger.h:
//     the trainer's zero_grad() still reaches what the group holds). A group whose
//     gradients are complete is reduce-scattered — stage 1 on the last micro-step only,
//     stages 2–3 every micro-step — strictly in group order, so all ranks issue the
//     same collectives; at stage 3 the unit is also released. Any number of backwards
//     may run per micro-step (several losses); each is one begin/end pair.
//  4. end_backward(): groups whose parameters took no part (no hook fired) are
//     reduced too, carrying what other backwards (another model's, through these
//     parameters) left in .grad since the trainer last cleared it; every reduction is
//     awaited and folded into the gradient shards.
//  4'. finish_window(), before the step: what the trainer cleared is dropped, and
//     gradients other backwards left after the last end_backward are reduced too.
//  5. step(): which parameters any rank gave a gradient is agreed (one all_reduce of a
//     byte per parameter over dp, and over the experts' group; gradient_presence.h), and
//     the optimizer, which steps each parameter's part of a master shard as a tensor of
//     its own, skips the others as LibTorch's skips an undefined .grad. Gradient
//     shards are scaled (1/N, loss-scale undo), the global norm is one
//     all_reduce of a float64 sum of squares (when clipping or checking for overflow),
//     a non-finite norm skips the step on every rank, the optimizer updates the master
//     shards, and the compute-dtype parameters are refreshed: written back into the
//     shard, and all-gathered in place for replicated groups.
//
// Offload ([offload], see offload/offloaded_adam.h): the masters, gradient shards and
// moments are an OffloadedAdam's host buffers (or its NVMe tier); reductions land in
// the host gradient shards as each group's reduce-scatter finishes, the step runs on
// the CPU, and the updated masters are copied into the compute-dtype shards. With
// parameter offload a stage-3 unit keeps no shard on the device: its gather reads
// this rank's part from the host master (or the file) first.
//
//   ZeroOptions options;  options.stage = 2;      // the [zero] section (core/config.h)
//   ShardedModel zero(*model, params, options, OffloadOptions{}, optimizer_options, dp, tracer, factory);
//   { auto scope = zero.use_scope(); loss = loss_fn(model->forward(x)); }
//   zero.begin_backward(/*last=*/true); { auto scope = zero.use_scope(); loss.backward(); }
//   zero.end_backward();  set_learning_rate(zero.optimizer(), lr);  zero.step(1.0 / N, clip, false);
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/config.h"
#include "parallax/core/trace.h"
#include "parallax/zero/parameter_interception.h"
#include "parallax/zero/reduction_group.h"
#include "parallax/zero/shard_layout.h"

namespace parallax::offload {
class OffloadedAdam;
}

namespace parallax::zero {

/// Builds the optimizer over the master shards, cut by parameter: masters[k] is one
/// parameter's elements in a flat group's master shard (a view, stepped in place, with
/// its own state and step count as LibTorch keeps them per parameter), and
/// `optimizer_group[k]` the optimizer parameter group of that parameter.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::Tensor> masters, const std::vector<std::size_t>& optimizer_group)>;

/// What one step did.
struct StepOutcome {
  bool skipped = false;     ///< non-finite gradients: nothing was updated
  double grad_norm = -1.0;  ///< global norm after scaling, before clipping; -1 if not computed
};

/// How the data-parallel group's model is split over other ranks, for set_model_parallel.
struct ModelParallel {
  /// The tensor-parallel group, when partial[] marks any gradient; else null.
  Communicator* tp = nullptr;
  /// Groups beyond dp whose ranks hold other parts of the model (tp, pp): the norm's
  /// squares are summed over each.
  std::vector<Communicator*> norm_groups;
  /// Per parameter: the weight of its squares in the norm, 1 / the ranks of the norm
  /// groups holding the same elements (1: split or unshared; 0: a copy another rank counts).
  std::vector<double> norm_weights;
  /// Per parameter: its gradient is a partial sum over tp (replicated under sequence parallelism).
  std::vector<bool> partial;
};

/// A parameter's elements in this rank's gradient shard.
struct GradientPart {
  std::int64_t param_offset = 0;  ///< first element, within the flattened parameter
  torch::Tensor values;           ///< a view of the gradient shard (fp32)
};

/// A run of params[param]'s elements in a master shard (Fragment: where in the parameter
/// and where in the shard).
struct MasterPart {
  std::size_t param = 0;
  Fragment fragment;
  /// The tensor the optimizer steps for this part, a view of the master shard whose
  /// first fragment.numel elements are the part's (the shard's last part also carries
  /// the shard's padding); its optimizer state is the part's. Undefined when offloaded.
  torch::Tensor stepped;
  /// Offloaded: the host optimizer's segment that is this part (its own step count).
  std::size_t segment = 0;
};

/// One flat group's fp32 master shard on this rank (the tensor the optimizer steps) and
/// the parameters' parts it holds.
struct MasterShard {
  torch::Tensor master;
  std::vector<MasterPart> parts;
};

class ShardedModel final : private ParameterUseListener {
 public:
  /// `params`: the trainable parameters of `model` (distinct, dense, one dtype),
  /// identical on every rank of `dp`. `make_optimizer` builds the optimizer over the
  /// master shards unless `offload` moves it to the host, where `optimizer` (each
  /// optimizer group's options, Adam or AdamW) gives its hyper-parameters. Throws ConfigError for an impossible option
  /// (a wrap type that matches no module, an NVMe directory that cannot take the
  /// file: then on every rank, so none waits for the failed one). Communicates only
  /// when offloading (one all_reduce over `dp` to agree that every rank is ready).
  /// `other`'s members (expert parallelism's experts) are sharded and reduced over its
  /// communicator in flat groups of their own (at stage 3, units of their own); step() still scales every
  /// gradient by `gradient_scale` and sums the norm's squares over `dp`, which counts
  /// each of their elements once when `other.comm`'s ranks partition dp's by what they hold.
  /// `optimizer_group_of_param` (empty: all 0) puts params[i] in an optimizer parameter
  /// group of its own options: a flat group (a stage-3 unit, a bucket) holds one group's
  /// parameters, so a unit or bucket holding several is cut, as for `other`.
  ShardedModel(torch::nn::Module& model,
               std::vector<torch::Tensor> params,
               const ZeroOptions& options,
               const OffloadOptions& offload,
               const std::vector<OptimizerOptions>& optimizer,
               Communicator& dp,
               Tracer& tracer,
               const OptimizerFactory& make_optimizer,
               const OtherReductionGroup& other = {},
               const std::vector<std::size_t>& optimizer_group_of_param = {});
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;
  ~ShardedModel() override;

  int stage() const { return options_.stage; }
  /// Stage 3: parameter uses are watched while the scope lives; otherwise inert.
  ParameterUseScope use_scope() const;

  /// Step 3 of the protocol. With `reduce_untouched` false (a pipeline chunk's backward,
  /// which writes only that chunk's gradients), stages 2–3 reduce only the groups this
  /// backward reached; the others' shards keep what earlier backwards reduced. Stage 1
  /// reduces every group on the last micro-step either way (its full buffers accumulate).
  /// Every rank of the group must pass the same values.
  void begin_backward(bool last_micro_step, bool reduce_untouched = true);
  /// Blocks until this micro-step's reductions are done; throws CommError.
  void end_backward();
  /// Step 4' of the protocol. Collective over dp only when late gradients exist (on
  /// every rank alike: the ranks run the same backwards). Throws CommError; UsageError
  /// for an fp16 parameter another backward left a gradient on (its scale is unknown).
  void finish_window();
  /// A micro-batch of several ended: what the groups hold is the window's, beyond the
  /// trainer's zero_grad() (gradient_ledger.h, f).
  void commit_micro_batch();
  /// The trainer's optimizer holds `sentinel`: its zero_grad() clears these gradients
  /// (gradient_ledger.h).
  void watch_zero_grad(torch::Tensor sentinel);
  /// Reductions finish_window() ran for late gradients since construction.
  std::int64_t late_reductions() const;
  /// Model parallelism around the data-parallel group (a model split over tensor and/or
  /// pipeline ranks; see ModelParallel). From then on step() sums the partial
  /// gradients' fragments in this rank's shard over `tp` (one all-reduce) and computes
  /// the global norm over dp and each norm group (one all-reduce each), every element
  /// weighted as norm_weights says. Every rank of `tp` must hold the same shard layout
  /// (the same parameter shapes, as a plan's parts have). Throws UsageError for vectors
  /// that do not match the parameters. Does not communicate.
  void set_model_parallel(const ModelParallel& model_parallel);
  /// This rank's part of params[i]'s gradient in its gradient shard (reduced after
  /// end_backward, unscaled until step), or nothing when the shard holds none of it.
  /// Writing the view changes what step() uses.
  std::optional<GradientPart> gradient_part(std::size_t i) const;

  /// Multiplies gradients by `gradient_scale`, clips to `clip_norm` (0 = off), checks
  /// for non-finite values when `skip_non_finite`, steps, refreshes parameters, zeroes
  /// gradients. Collective; blocks.
  StepOutcome step(double gradient_scale, double clip_norm, bool skip_non_finite);

  /// The optimizer over this rank's master shards (for the learning rate, its state);
  /// not available when offloaded.
  torch::optim::Optimizer& optimizer();
  const torch::optim::Optimizer& optimizer() const;
  /// The host optimizer when [offload] moved it there, else null.
  offload::OffloadedAdam* offloaded_optimizer();
  const offload::OffloadedAdam* offloaded_optimizer() const;

  /// Collective: the full fp32 master parameters, in the order of `params`.
  std::vector<torch::Tensor> gather_masters();
  /// This rank's master shards, one per group, for reading or overwriting them (a
  /// checkpoint); each rank of dp holds disjoint parts. With an offloaded optimizer the
  /// masters live in it (offloaded_optimizer()->state(group)): `master` is undefined and
  /// only the parts are given.
  std::vector<MasterShard> master_shards() const;
  /// After master shards were overwritten between steps (in the offloaded optimizer's
  /// state too): the compute-dtype parameters are refreshed from them as step()
  /// refreshes them. Collective over dp.
  void masters_changed();

  /// Bytes this rank holds now.
  std::int64_t parameter_bytes() const;
  std::int64_t gradient_bytes() const;
  std::int64_t master_bytes() const;
  /// Offloaded state: bytes in host memory and in the NVMe tier's file.
  std::int64_t host_bytes() const;
  std::int64_t nvme_bytes() const;
  /// Padding elements over all groups (each group pads to a multiple of N).
  std::int64_t padding_elements() const;
  /// Of them, the padding of the flat groups sharded over the OtherReductionGroup's communicator.
  std::int64_t other_group_padding_elements() const;
  std::size_t group_count() const;
  /// Stage 3: units (sharded groups), the most bytes gathered at once, and the bytes
  /// of the largest unit.
  std::size_t unit_count() const;
  std::int64_t peak_gathered_bytes() const;
  std::int64_t largest_unit_bytes() const;
  /// Stage 3: times the recorded forward or backward order of units changed.
  std::int64_t order_changes() const;
  /// Stage 3, since construction: a unit's first use in a pass either finds its gather
  /// already launched by an earlier use (prefetched: the all_gather overlapped the
  /// compute in between) or launches it and waits (on use).
  std::int64_t prefetched_uses() const;
  std::int64_t gathers_on_use() const;

 private:
  struct State;
  void on_parameter_uses(const std::vector<std::size_t>& units, bool in_step, bool nested) override;
  void on_gradient_ready(std::size_t param_index);
  void check_scale_of_live_gradient(std::size_t param_index) const;
  /// Takes every gradient .grad holds that the groups do not (other backwards').
  void absorb_live_gradients();
  std::unique_ptr<State> state_;
  ZeroOptions options_;
};

}  // namespace parallax::zero
