// Stage 3's decisions about when each unit's parameters are gathered and released:
// pure bookkeeping, no tensors, so it is tested step by step without ranks.
//
// A unit is a set of parameters gathered and released together (one flat buffer).
// The executor (ShardedModel) reports events and carries out the returned actions in
// order; every rank sees the same events in the same order, so every rank issues the
// same collectives.
//
// Protocol for one micro-step:
//  a. Forward: touch(u) when an operator uses a parameter of unit u (touch(units) when
//     it uses several: all are kept while it runs; an operator inside another releases
//     nothing). First, with
//     `reshard_after_forward`, units used earlier in this pass are released, least
//     recently used first, until they and u fit within `max_live_bytes` (whether u was
//     prefetched or not: so the gathered bytes stay within the budget plus one unit,
//     plus prefetch). A released u is gathered. Then the units after u in the order
//     recorded in the previous forward are prefetched while the bytes gathered ahead of
//     use stay within `prefetch_bytes`.
//  b. end_forward(): with `reshard_after_forward`, every unit is released but the one
//     the forward used last (backward uses it first; it is released as in (c)); the
//     forward order just seen replaces the recorded one if it differs.
//  c. Backward: touch(u) as in (a), prefetching along the recorded backward order;
//     backward_done(u) once every gradient of u is ready releases u.
//  d. end_backward(): releases what is left (units whose gradients never came) and
//     records the backward order.
// Without `reshard_after_backward`, (c) and (d) release nothing: units stay gathered
// until end_step(), which releases every one (the optimizer step changes the shards).
//  e. end_step(): releases every unit still gathered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parallax::zero {

class GatherSchedule {
 public:
  enum class Phase { kForward, kBackward };

  /// What the executor must do, in this order: releases, then gathers (launched).
  struct Actions {
    std::vector<std::size_t> gather;
    std::vector<std::size_t> release;
  };

  /// `unit_bytes`: gathered size of each unit (bytes, > 0).
  GatherSchedule(std::vector<std::int64_t> unit_bytes,
                 std::int64_t prefetch_bytes,
                 std::int64_t max_live_bytes,
                 bool reshard_after_forward,
                 bool reshard_after_backward = true);

  Actions touch(std::size_t unit, Phase phase) { return touch(std::vector<std::size_t>{unit}, phase); }
  /// One operator's use of several units (distinct): each is touched, and none of them
  /// is released to make room for another. Without `may_release` (an operator inside
  /// another, which may still read units it touched) nothing is released.
  Actions touch(const std::vector<std::size_t>& units, Phase phase, bool may_release = true);
  Actions end_forward();
  Actions backward_done(std::size_t unit);
  Actions end_backward();
  Actions end_step();

  bool gathered(std::size_t unit) const { return gathered_.at(unit); }
  /// Bytes gathered now, and the most ever gathered at once (bytes).
  std::int64_t live_bytes() const { return live_bytes_; }
  std::int64_t peak_live_bytes() const { return peak_live_bytes_; }
  /// Times a pass's order differed from the recorded one and replaced it.
  std::int64_t order_changes() const { return order_changes_; }
  const std::vector<std::size_t>& recorded_order(Phase phase) const { return recorded_[index(phase)]; }

 private:
  static std::size_t index(Phase phase) { return phase == Phase::kForward ? 0 : 1; }
  void gather(std::size_t unit, Actions& actions);
  void release(std::size_t unit, Actions& actions);
  void prefetch_after(std::size_t unit, Phase phase, Actions& actions);
  void evict_beyond_budget(const std::vector<std::size_t>& keep, Actions& actions);
  void finish_pass(Phase phase);

  std::vector<std::int64_t> bytes_;
  std::int64_t prefetch_bytes_;
  std::int64_t max_live_bytes_;
  bool reshard_after_forward_;
  bool reshard_after_backward_;

  std::vector<bool> gathered_;
  std::vector<bool> touched_;  ///< used in the current pass
  std::vector<bool> done_;     ///< backward finished in the current pass
  std::vector<std::int64_t> last_use_;
  std::int64_t clock_ = 0;
  std::int64_t live_bytes_ = 0;
  std::int64_t peak_live_bytes_ = 0;
  std::int64_t order_changes_ = 0;
  std::vector<std::size_t> current_[2];   ///< first touches of this pass, per phase
  std::vector<std::size_t> recorded_[2];  ///< the previous pass's
};

}  // namespace parallax::zero
