#include "parallax/core/flight_recorder.h"

#include <chrono>
#include <cstdio>
#include <sstream>

namespace parallax {
namespace {

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

FlightRecorder::FlightRecorder() : ring_(kCapacity), origin_s_(monotonic_s()) {}

FlightRecorder& FlightRecorder::instance() {
  static FlightRecorder recorder;  // never destroyed before the threads that record
  return recorder;
}

double FlightRecorder::now_s() const {
  return monotonic_s() - origin_s_;
}

FlightRecorder::Begun FlightRecorder::begin(const std::string& group, const std::string& op, std::int64_t bytes) {
  const double now = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveRecord& slot = ring_[next_id_ % kCapacity];
  slot = CollectiveRecord{next_id_, group, op, ++sequences_[group], bytes, step_, now, -1.0, false};
  return {next_id_++, slot.sequence, step_};
}

void FlightRecorder::end(std::uint64_t id, bool ok) {
  const double now = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveRecord& slot = ring_[id % kCapacity];
  if (slot.id != id || slot.ended_s >= 0) return;
  slot.ended_s = now;
  slot.ok = ok;
}

void FlightRecorder::set_step(std::int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
}

std::int64_t FlightRecorder::step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return step_;
}

std::vector<CollectiveRecord> FlightRecorder::recent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  const std::uint64_t first = next_id_ > kCapacity ? next_id_ - kCapacity : 1;
  for (std::uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % kCapacity]);
  return out;
}

std::optional<CollectiveRecord> FlightRecorder::oldest_pending() const {
  for (const CollectiveRecord& record : recent()) {
    if (record.ended_s < 0) return record;
  }
  return std::nullopt;
}

std::string FlightRecorder::describe(const CollectiveRecord& record) {
  std::ostringstream out;
  out << record.op << " #" << record.sequence << " of " << record.group << " (" << record.bytes << " bytes, ";
  if (record.step >= 0) {
    out << "step " << record.step << ")";
  } else {
    out << "before the first step)";
  }
  return out.str();
}

std::string FlightRecorder::dump(std::size_t count) const {
  const std::vector<CollectiveRecord> all = recent();
  std::ostringstream out;
  const double now = now_s();
  for (std::size_t i = all.size() > count ? all.size() - count : 0; i < all.size(); ++i) {
    const CollectiveRecord& r = all[i];
    char timing[96];
    if (r.ended_s < 0) {
      std::snprintf(timing, sizeof(timing), "pending for %.3f s", now - r.started_s);
    } else {
      std::snprintf(timing, sizeof(timing), "%s in %.3f ms", r.ok ? "done" : "failed", (r.ended_s - r.started_s) * 1e3);
    }
    out << "  " << describe(r) << ": " << timing << "\n";
  }
  return out.str();
}

}  // namespace parallax
