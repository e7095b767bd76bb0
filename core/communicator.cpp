#include "parallax/core/communicator.h"

namespace parallax {

const char* to_string(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kBroadcast: return "broadcast";
    case CommOp::kSend: return "send";
    case CommOp::kRecv: return "recv";
    case CommOp::kBarrier: return "barrier";
  }
  return "?";
}

CommCounters CommCounters::since(const CommCounters& earlier) const {
  CommCounters delta;
  for (std::size_t i = 0; i < kCommOpCount; ++i) {
    delta.ops[i].calls = ops[i].calls - earlier.ops[i].calls;
    delta.ops[i].bytes = ops[i].bytes - earlier.ops[i].bytes;
    delta.ops[i].nanoseconds = ops[i].nanoseconds - earlier.ops[i].nanoseconds;
  }
  return delta;
}

CommCounters& CommCounters::operator+=(const CommCounters& other) {
  for (std::size_t i = 0; i < kCommOpCount; ++i) {
    ops[i].calls += other.ops[i].calls;
    ops[i].bytes += other.ops[i].bytes;
    ops[i].nanoseconds += other.ops[i].nanoseconds;
  }
  return *this;
}

CommCounters Communicator::counters() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return counters_;
}

void Communicator::record(CommOp op, std::int64_t bytes, std::int64_t nanoseconds) {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  OpCounter& counter = counters_[op];
  counter.calls += 1;
  counter.bytes += bytes;
  counter.nanoseconds += nanoseconds;
}

void Communicator::set_default_timeout(std::chrono::milliseconds timeout) {
  default_timeout_ms_.store(timeout.count());
}

std::chrono::milliseconds Communicator::default_timeout() const {
  return std::chrono::milliseconds(default_timeout_ms_.load());
}

std::chrono::milliseconds Communicator::timeout_for(const CollectiveOptions& options) const {
  return options.timeout.count() > 0 ? options.timeout : default_timeout();
}

std::int64_t payload_bytes(const at::Tensor& tensor) {
  return static_cast<std::int64_t>(tensor.numel()) * static_cast<std::int64_t>(tensor.element_size());
}

}  // namespace parallax
