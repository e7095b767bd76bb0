#include "parallax/zero/gather_schedule.h"

#include <algorithm>

#include "parallax/core/error.h"

namespace parallax::zero {

GatherSchedule::GatherSchedule(std::vector<std::int64_t> unit_bytes,
                               std::int64_t prefetch_bytes,
                               std::int64_t max_live_bytes,
                               bool reshard_after_forward,
                               bool reshard_after_backward)
    : bytes_(std::move(unit_bytes)),
      prefetch_bytes_(prefetch_bytes),
      max_live_bytes_(max_live_bytes),
      reshard_after_forward_(reshard_after_forward),
      reshard_after_backward_(reshard_after_backward),
      gathered_(bytes_.size(), false),
      touched_(bytes_.size(), false),
      done_(bytes_.size(), false),
      last_use_(bytes_.size(), 0) {}

GatherSchedule::Actions GatherSchedule::touch(const std::vector<std::size_t>& units, Phase phase, bool may_release) {
  Actions actions;
  for (const std::size_t unit : units) {
    PARALLAX_ASSERT(unit < bytes_.size(), "unit ", unit, " of ", bytes_.size());
    last_use_[unit] = ++clock_;
    if (!touched_[unit]) {
      touched_[unit] = true;
      current_[index(phase)].push_back(unit);
    }
  }
  // Make room first, so the peak is the budget plus these units (plus prefetch), whether
  // they must be gathered now or a prefetch already did.
  if (phase == Phase::kForward && reshard_after_forward_ && may_release) evict_beyond_budget(units, actions);
  for (const std::size_t unit : units) {
    if (!gathered_[unit]) gather(unit, actions);
  }
  for (const std::size_t unit : units) prefetch_after(unit, phase, actions);
  return actions;
}

GatherSchedule::Actions GatherSchedule::end_forward() {
  Actions actions;
  if (reshard_after_forward_) {
    // The unit the forward used last is the one backward uses first: releasing it only to
    // gather it again at once would move its bytes twice for nothing (FSDP2 keeps its root
    // unit for the same reason).
    std::size_t last = bytes_.size();
    for (std::size_t u = 0; u < bytes_.size(); ++u) {
      if (gathered_[u] && touched_[u] && (last == bytes_.size() || last_use_[u] > last_use_[last])) last = u;
    }
    for (std::size_t u = 0; u < bytes_.size(); ++u) {
      if (gathered_[u] && u != last) release(u, actions);
    }
  }
  finish_pass(Phase::kForward);
  return actions;
}

GatherSchedule::Actions GatherSchedule::backward_done(std::size_t unit) {
  PARALLAX_ASSERT(unit < bytes_.size(), "unit ", unit, " of ", bytes_.size());
  Actions actions;
  done_[unit] = true;
  if (gathered_[unit] && reshard_after_backward_) release(unit, actions);
  return actions;
}

GatherSchedule::Actions GatherSchedule::end_backward() {
  Actions actions;
  if (reshard_after_backward_) {
    for (std::size_t u = 0; u < bytes_.size(); ++u) {
      if (gathered_[u]) release(u, actions);
    }
  }
  finish_pass(Phase::kBackward);
  std::fill(done_.begin(), done_.end(), false);
  return actions;
}

GatherSchedule::Actions GatherSchedule::end_step() {
  Actions actions;
  for (std::size_t u = 0; u < bytes_.size(); ++u) {
    if (gathered_[u]) release(u, actions);
  }
  return actions;
}

void GatherSchedule::gather(std::size_t unit, Actions& actions) {
  gathered_[unit] = true;
  live_bytes_ += bytes_[unit];
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  actions.gather.push_back(unit);
}

void GatherSchedule::release(std::size_t unit, Actions& actions) {
  gathered_[unit] = false;
  live_bytes_ -= bytes_[unit];
  actions.release.push_back(unit);
}

void GatherSchedule::prefetch_after(std::size_t unit, Phase phase, Actions& actions) {
  const std::vector<std::size_t>& order = recorded_[index(phase)];
  const auto here = std::find(order.begin(), order.end(), unit);
  if (here == order.end()) return;
  // Bytes already gathered ahead of use in this pass count against the budget.
  std::int64_t ahead = 0;
  for (std::size_t u = 0; u < bytes_.size(); ++u) {
    if (gathered_[u] && !touched_[u]) ahead += bytes_[u];
  }
  for (auto next = here + 1; next != order.end(); ++next) {
    const std::size_t u = *next;
    if (gathered_[u] || touched_[u] || done_[u]) continue;
    if (ahead + bytes_[u] > prefetch_bytes_) break;
    ahead += bytes_[u];
    gather(u, actions);
  }
}

void GatherSchedule::evict_beyond_budget(const std::vector<std::size_t>& keep, Actions& actions) {
  // What counts against the budget: the units gathered and used in this pass, `keep`
  // included (touched by now); prefetched units (gathered, not yet used) are about to be
  // needed and count against the prefetch budget instead.
  const auto kept = [&](std::size_t u) { return std::find(keep.begin(), keep.end(), u) != keep.end(); };
  std::int64_t used = 0;
  std::int64_t needed = 0;
  for (std::size_t u = 0; u < bytes_.size(); ++u) {
    if (kept(u)) {
      needed += bytes_[u];
    } else if (gathered_[u] && touched_[u]) {
      used += bytes_[u];
    }
  }
  while (used + needed > max_live_bytes_) {
    // The least recently used of them that is not kept.
    std::size_t victim = bytes_.size();
    for (std::size_t u = 0; u < bytes_.size(); ++u) {
      if (kept(u) || !gathered_[u] || !touched_[u]) continue;
      if (victim == bytes_.size() || last_use_[u] < last_use_[victim]) victim = u;
    }
    if (victim == bytes_.size()) return;
    used -= bytes_[victim];
    release(victim, actions);
  }
}

void GatherSchedule::finish_pass(Phase phase) {
  std::vector<std::size_t>& current = current_[index(phase)];
  std::vector<std::size_t>& recorded = recorded_[index(phase)];
  if (current != recorded) {
    if (!recorded.empty()) ++order_changes_;
    recorded = current;
  }
  current.clear();
  std::fill(touched_.begin(), touched_.end(), false);
}

}  // namespace parallax::zero
