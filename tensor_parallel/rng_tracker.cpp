#include "parallax/tensor_parallel/rng_tracker.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <mutex>

#include "parallax/core/error.h"

namespace parallax::tensor_parallel {
namespace {

at::Generator default_generator() {
  return at::detail::getDefaultCPUGenerator();
}

torch::Tensor state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator& generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace

void RngTracker::add(const std::string& name, std::uint64_t seed) {
  PARALLAX_CHECK(!streams_.count(name), UsageError, "random stream '", name, "' exists already");
  at::Generator fresh = at::detail::createCPUGenerator(seed);
  streams_[name] = state_of(fresh);
}

RngTracker::Fork::Fork(RngTracker& tracker, const std::string& name) : tracker_(&tracker), name_(name) {
  const auto found = tracker.streams_.find(name);
  PARALLAX_CHECK(found != tracker.streams_.end(), UsageError, "no random stream '", name, "'");
  at::Generator generator = default_generator();
  outside_ = state_of(generator);
  set_state(generator, found->second);
}

RngTracker::Fork::~Fork() {
  at::Generator generator = default_generator();
  tracker_->streams_[name_] = state_of(generator);
  set_state(generator, outside_);
}

RngTracker::Snapshot RngTracker::capture() const {
  Snapshot snapshot;
  snapshot.default_state = state_of(default_generator());
  for (const auto& [name, state] : streams_) snapshot.streams[name] = state.clone();
  return snapshot;
}

void RngTracker::restore(const Snapshot& snapshot) {
  at::Generator generator = default_generator();
  set_state(generator, snapshot.default_state);
  for (const auto& [name, state] : snapshot.streams) streams_[name] = state.clone();
}

}  // namespace parallax::tensor_parallel
