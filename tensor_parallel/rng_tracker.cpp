#include "parallax/tensor_parallel/rng_tracker.h"

#include "parallax/core/cpu_generator.h"
#include "parallax/core/error.h"

namespace parallax::tensor_parallel {

void RngTracker::add(const std::string& name, std::uint64_t seed) {
  PARALLAX_CHECK(!streams_.count(name), UsageError, "random stream '", name, "' exists already");
  streams_[name] = cpu_generator_state(at::detail::createCPUGenerator(seed));
}

RngTracker::Fork::Fork(RngTracker& tracker, const std::string& name) : tracker_(&tracker), name_(name) {
  const auto found = tracker.streams_.find(name);
  PARALLAX_CHECK(found != tracker.streams_.end(), UsageError, "no random stream '", name, "'");
  outside_ = cpu_generator_state();
  set_cpu_generator_state(found->second);
}

RngTracker::Fork::~Fork() {
  tracker_->streams_[name_] = cpu_generator_state();
  set_cpu_generator_state(outside_);
}

RngTracker::Snapshot RngTracker::capture() const {
  Snapshot snapshot;
  snapshot.default_state = cpu_generator_state();
  for (const auto& [name, state] : streams_) snapshot.streams[name] = state.clone();
  return snapshot;
}

void RngTracker::restore(const Snapshot& snapshot) {
  set_cpu_generator_state(snapshot.default_state);
  for (const auto& [name, state] : snapshot.streams) streams_[name] = state.clone();
}

}  // namespace parallax::tensor_parallel
