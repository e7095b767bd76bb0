// ShardedModel's state, shared by its translation units (sharded_model.cpp: the
// protocol; sharded_model_state.cpp: the masters and the accounting). Internal to zero/.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "parallax/offload/offloaded_adam.h"
#include "parallax/offload/side_stream.h"
#include "parallax/zero/flat_group.h"
#include "parallax/zero/gather_schedule.h"
#include "parallax/zero/gradient_ledger.h"
#include "parallax/zero/sharded_model.h"

namespace parallax::zero {

struct ShardedModel::State {
  Communicator* dp = nullptr;  ///< the norm's group, and every flat group's unless group_comm says otherwise
  /// Per flat group, the group it is sharded and reduced over: dp, or the experts' own
  /// (OtherReductionGroup).
  std::vector<Communicator*> group_comm;
  Communicator& comm_of(std::size_t g) const { return *group_comm[g]; }
  Tracer* tracer = nullptr;
  std::vector<torch::Tensor> params;
  std::vector<std::unique_ptr<FlatGroup>> groups;  ///< reduction (and launch) order
  std::vector<std::size_t> group_of_param;
  std::vector<std::size_t> index_in_group;
  /// Model parallelism (set_model_parallel): the groups beyond dp the norm's squares are
  /// summed over, the shard fragments whose norm weight is not 1, and those whose
  /// gradients are partial over tp.
  Communicator* tp = nullptr;
  std::vector<Communicator*> norm_groups;
  struct WeightedFragment {
    std::size_t group;
    Fragment fragment;
    double weight;  ///< ModelParallel::norm_weights of its parameter
  };
  std::vector<WeightedFragment> shared_fragments;                   ///< norm weight != 1
  std::vector<std::pair<std::size_t, Fragment>> partial_fragments;  ///< (group, fragment)
  /// Stage 3: group index of each unit, and the unit of each group (-1: replicated).
  std::vector<std::size_t> unit_groups;
  std::vector<std::ptrdiff_t> unit_of_group;
  std::unique_ptr<GatherSchedule> schedule;
  std::vector<WorkPtr> gathers;                        ///< in-flight gather per unit
  std::int64_t prefetched_uses = 0;                    ///< first uses whose gather was already in flight
  std::int64_t gathers_on_use = 0;                     ///< first uses that had to launch their own gather
  std::unique_ptr<torch::optim::Optimizer> optimizer;  ///< unless offloaded, over `pieces`
  /// Each parameter's part of a master shard, [begin, end) of its group's shard (with the
  /// shard's padding after it, when it is the last), in group order: the unit the
  /// optimizer steps (unless offloaded, part.stepped, whose .grad is `grad`, the part of
  /// the gradient shard, undefined for a step that skips it; offloaded, a segment of the
  /// host optimizer). A shard of padding only is a piece of its own, of parameter
  /// kPadding, always stepped.
  static constexpr std::size_t kPadding = static_cast<std::size_t>(-1);
  struct Piece {
    MasterPart part;
    torch::Tensor grad;
    std::size_t group = 0;  ///< the flat group
    std::int64_t begin = 0, end = 0;
  };
  std::vector<Piece> pieces;
  OtherReductionGroup experts;  ///< the parameters reduced over another group
  std::unique_ptr<offload::OffloadedAdam> offloaded;   ///< [offload] optimizer != none
  std::unique_ptr<offload::SideStreamCopies> copies;   ///< offloaded: between the device and the host
  std::unique_ptr<GradientLedger> ledger;
  /// Stage 3: each unit named by its first parameter, for messages.
  std::vector<std::string> unit_names;
  /// Stage 3: the units' storages, for the scopes and the watch (null otherwise).
  std::shared_ptr<ParameterRegistry> registry;

  std::mutex mutex;                                         ///< hooks and parameter uses may come from autograd threads
  std::optional<GradientLedger::OwnBackward> own_backward;  ///< from begin_backward to end_backward
  std::int64_t late_reductions = 0;
  bool window_reduced = false;  ///< a backward of this window reduced (stage 1 reduces once)
  bool reduce_this_micro_step = false;
  bool reduce_untouched = true;  ///< this backward reduces groups no gradient reached
  bool in_backward = false;
  std::vector<bool> complete;  ///< per group, this micro-step
  std::vector<WorkPtr> reductions;
  std::size_t next_to_reduce = 0;
  std::size_t next_to_reap = 0;
  /// Full-gradient bytes of reductions in flight beyond the newest (make_room_for_
  /// reduction_locked); 0: unbounded (stage 1 keeps its full buffers anyway).
  std::int64_t reduction_budget_bytes = 0;

  /// Launches reductions in group order: the complete groups up to the first that is
  /// not (all = false), or every group left (all = true; those no gradient reached only
  /// when `untouched`). Every rank launches the same ones: the same backward reaches the
  /// same groups on every rank.
  void launch_reductions_locked(bool all, bool untouched = true) {
    while (next_to_reduce < groups.size() && (all || complete[next_to_reduce])) {
      if (untouched || groups[next_to_reduce]->has_gradients()) {
        make_room_for_reduction_locked(groups[next_to_reduce]->full_gradient_bytes());
        reductions[next_to_reduce] = groups[next_to_reduce]->reduce(comm_of(next_to_reduce));
      }
      ++next_to_reduce;
    }
  }

  /// Folds finished reductions into their shards, in order, so each group's full
  /// gradient buffer is freed as soon as its reduce-scatter is done rather than at the
  /// end of backward.
  void reap_finished_reductions_locked() {
    for (std::size_t g = next_to_reap; g < next_to_reduce; ++g) {
      if (reductions[g] && !reductions[g]->is_completed()) return;
      finish_reduction(g);
    }
  }

  /// Stages 2–3 (whose full gradient buffers live only until their reduction is
  /// reaped): before a reduction of `bytes` launches, waits for the oldest in flight
  /// while they and it would pass reduction_budget_bytes (one always goes). A backward
  /// that runs ahead of its reductions (a busy network, ranks sharing cores) then holds
  /// about two buckets of full gradients, as the planner counts, not the whole model's.
  void make_room_for_reduction_locked(std::int64_t bytes) {
    if (reduction_budget_bytes <= 0) return;
    std::int64_t in_flight = 0;
    for (std::size_t g = next_to_reap; g < next_to_reduce; ++g) {
      if (reductions[g]) in_flight += groups[g]->full_gradient_bytes();
    }
    while (next_to_reap < next_to_reduce && in_flight + bytes > reduction_budget_bytes) {
      const std::size_t oldest = next_to_reap;
      if (reductions[oldest]) in_flight -= groups[oldest]->full_gradient_bytes();
      finish_reduction(oldest);
    }
  }

  void finish_reduction(std::size_t g) {
    if (reductions[g]) {
      reductions[g]->wait();  // returns at once when completed; throws if it failed
      reductions[g].reset();
      groups[g]->complete_reduction();
    }
    next_to_reap = g + 1;
  }

  /// The compute-dtype parameters from the updated masters (after a step or a load):
  /// each group's shard is written back (or, offloaded, fetched from the host; with
  /// parameter offload the next gather fetches it), and replicated groups gather theirs.
  void publish_masters() {
    std::vector<WorkPtr> pending;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      FlatGroup& group = *groups[g];
      if (!offloaded) {
        group.write_back_master();
      } else if (group.shard().defined()) {
        group.set_pending_update(read_master(g, group.shard()));
      }
      if (group.residency() == Residency::kReplicated) pending.push_back(group.gather_updated(comm_of(g)));
    }
    for (const auto& work : pending) work->wait();
  }

  /// Offloaded: group g's updated master into `destination` (compute dtype, on the
  /// device): converted on the host, then copied on the side stream.
  offload::HostCopy read_master(std::size_t g, const torch::Tensor& destination) {
    if (destination.is_cpu()) {
      offloaded->read_master(g, destination);
      return offload::HostCopy();
    }
    const torch::Tensor staging = copies->host_buffer(destination.numel(), destination.scalar_type());
    offloaded->read_master(g, staging);
    return copies->copy(destination, staging);  // LibTorch's pinned cache holds `staging` until done
  }

  void apply_locked(const GatherSchedule::Actions& actions) {
    for (const std::size_t unit : actions.release) {
      if (gathers[unit]) {  // prefetched and never used: the buffer is still being written
        gathers[unit]->wait();
        gathers[unit].reset();
      }
      groups[unit_groups[unit]]->release();
    }
    for (const std::size_t unit : actions.gather)
      gathers[unit] = groups[unit_groups[unit]]->gather(comm_of(unit_groups[unit]));
  }
};

}  // namespace parallax::zero
