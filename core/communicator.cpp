#include "parallax/core/communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "parallax/core/error.h"

namespace parallax {

const char* to_string(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

CommCounters CommCounters::since(const CommCounters& earlier) const {
  CommCounters delta;
  for (std::size_t i = 0; i < kCommOpCount; ++i) {
    delta.ops[i].calls = ops[i].calls - earlier.ops[i].calls;
    delta.ops[i].bytes = ops[i].bytes - earlier.ops[i].bytes;
    delta.ops[i].nanoseconds = ops[i].nanoseconds - earlier.ops[i].nanoseconds;
    delta.ops[i].inter_node_bytes = ops[i].inter_node_bytes - earlier.ops[i].inter_node_bytes;
  }
  return delta;
}

CommCounters& CommCounters::operator+=(const CommCounters& other) {
  for (std::size_t i = 0; i < kCommOpCount; ++i) {
    ops[i].calls += other.ops[i].calls;
    ops[i].bytes += other.ops[i].bytes;
    ops[i].nanoseconds += other.ops[i].nanoseconds;
    ops[i].inter_node_bytes += other.ops[i].inter_node_bytes;
  }
  return *this;
}

CommCounters Communicator::counters() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return counters_;
}

void Communicator::set_member_nodes(std::vector<int> nodes) {
  PARALLAX_CHECK(static_cast<int>(nodes.size()) == size(), UsageError, "group '", name(), "' has ", size(),
                 " ranks but ", nodes.size(), " nodes were given for them");
  std::lock_guard<std::mutex> lock(counters_mutex_);
  spans_nodes_ = std::any_of(nodes.begin(), nodes.end(), [&](int node) { return node != nodes.front(); });
  member_nodes_ = std::move(nodes);
}

void Communicator::record(CommOp op, std::int64_t bytes, std::int64_t nanoseconds, int peer) {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  const bool crosses = peer < 0 ? spans_nodes_
                                : !member_nodes_.empty() && member_nodes_[static_cast<std::size_t>(peer)] !=
                                                                member_nodes_[static_cast<std::size_t>(rank())];
  OpCounter& counter = counters_[op];
  counter.calls += 1;
  counter.bytes += bytes;
  counter.nanoseconds += nanoseconds;
  if (crosses) counter.inter_node_bytes += bytes;
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

std::string Communicator::error_prefix(CommOp op) const {
  return detail::concat(to_string(op), " on group '", name(), "': ");
}

std::string Communicator::describe_op(CommOp op, const at::Tensor& tensor, std::int64_t bytes) const {
  return detail::concat(to_string(op), " on group '", name(), "' (", size(), " ranks, ", bytes, " bytes, ",
                        dtype_name(tensor.scalar_type()), ")", step_suffix());
}

std::string Communicator::step_suffix() const {
  const std::int64_t s = step();
  return s < 0 ? std::string() : " at step " + std::to_string(s);
}

void Communicator::check_same_dtype(CommOp op, const at::Tensor& output, const at::Tensor& input) const {
  PARALLAX_CHECK(output.scalar_type() == input.scalar_type(), UsageError, error_prefix(op), "output dtype ",
                 dtype_name(output.scalar_type()), " differs from input dtype ", dtype_name(input.scalar_type()));
}

void Communicator::check_reduce_op(CommOp op, const at::Tensor& tensor, ReduceOp reduce) const {
  PARALLAX_CHECK(reduce != ReduceOp::kAvg || is_floating_dtype(tensor.scalar_type()), UsageError, error_prefix(op),
                 "avg of an integer tensor (", dtype_name(tensor.scalar_type()),
                 ") is not supported; use sum and divide");
}

void Communicator::check_shards(
    CommOp op, const at::Tensor& full, const char* full_role, const at::Tensor& shard, const char* shard_role) const {
  PARALLAX_CHECK(full.numel() == size() * shard.numel(), UsageError, error_prefix(op), full_role, " has ", full.numel(),
                 " elements but must hold size() (", size(), ") × ", shard_role, " (", shard.numel(),
                 ") = ", size() * shard.numel());
}

void Communicator::check_peer(CommOp op, int peer, const char* role) const {
  PARALLAX_CHECK(peer >= 0 && peer < size(), UsageError, error_prefix(op), role, " = ", peer,
                 " is out of range for a group of ", size(), " ranks");
}

std::int64_t Communicator::check_all_to_all(const at::Tensor& output,
                                            const std::vector<std::int64_t>& output_rows,
                                            const at::Tensor& input,
                                            const std::vector<std::int64_t>& input_rows) const {
  const CommOp op = CommOp::kAllToAll;
  check_same_dtype(op, output, input);
  PARALLAX_CHECK(output.dim() >= 1 && input.dim() >= 1 && output.sizes().slice(1) == input.sizes().slice(1),
                 UsageError, error_prefix(op), "output ", output.sizes(), " and input ", input.sizes(),
                 " must be at least 1-d with the same shape past dim 0");
  auto check_rows = [&](const std::vector<std::int64_t>& rows, const at::Tensor& tensor, const char* role) {
    PARALLAX_CHECK(static_cast<int>(rows.size()) == size(), UsageError, error_prefix(op), role, " has ", rows.size(),
                   " row counts; the group has ", size(), " ranks");
    std::int64_t total = 0;
    for (std::int64_t n : rows) {
      PARALLAX_CHECK(n >= 0, UsageError, error_prefix(op), role, " holds a negative row count ", n);
      total += n;
    }
    PARALLAX_CHECK(total == tensor.size(0), UsageError, error_prefix(op), role, " sums to ", total,
                   " rows but the tensor has ", tensor.size(0));
  };
  check_rows(output_rows, output, "output_rows");
  check_rows(input_rows, input, "input_rows");
  return input.size(0) == 0 ? (output.size(0) == 0 ? 0 : output.numel() / output.size(0))
                            : input.numel() / input.size(0);
}

std::vector<int> ranks_differing_from_root(Communicator& comm, std::uint64_t value) {
  at::Tensor mine = at::empty({1}, at::kLong);
  mine.data_ptr<std::int64_t>()[0] = static_cast<std::int64_t>(value);
  at::Tensor all = at::empty({comm.size()}, at::kLong);
  comm.all_gather(all, mine)->wait();
  const std::int64_t* values = all.data_ptr<std::int64_t>();
  std::vector<int> differing;
  for (int r = 0; r < comm.size(); ++r) {
    if (values[r] != values[0]) differing.push_back(r);
  }
  return differing;
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& value) {
  const int size = comm.size();
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(value.size()), at::kLong);
  at::Tensor lengths = at::empty({size}, at::kLong);
  comm.all_gather(lengths, length)->wait();
  // At least one byte per rank: a zero-sized all_gather helps nobody.
  const std::int64_t width = std::max<std::int64_t>(1, lengths.max().item<std::int64_t>());
  at::Tensor mine = at::zeros({width}, at::kByte);
  std::memcpy(mine.data_ptr<std::uint8_t>(), value.data(), value.size());
  at::Tensor all = at::empty({size * width}, at::kByte);
  comm.all_gather(all, mine)->wait();
  const auto* data = all.data_ptr<std::uint8_t>();
  const auto* lens = lengths.data_ptr<std::int64_t>();
  std::vector<std::string> values;
  values.reserve(static_cast<std::size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    values.emplace_back(reinterpret_cast<const char*>(data + rank * width), static_cast<std::size_t>(lens[rank]));
  }
  return values;
}

void run_everywhere(Communicator& comm, const char* what, const std::function<void()>& action) {
  std::exception_ptr error;
  try {
    action();
  } catch (const Error&) {
    error = std::current_exception();
  }
  at::Tensor failed = at::full({1}, error ? 1 : 0, at::kLong);
  comm.all_reduce(failed, {ReduceOp::kSum})->wait();
  if (error) std::rethrow_exception(error);
  const auto others = failed.item<std::int64_t>();
  PARALLAX_CHECK(others == 0, UsageError, what, " failed on ", others, " other rank(s); see their messages");
}

void sum_in_place(Communicator& comm, const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return;
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  at::Tensor joined = at::cat(flat);
  comm.all_reduce(joined)->wait();
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(joined.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

const char* dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kByte:
      return "uint8";
    default:
      return c10::toString(dtype);
  }
}

bool is_floating_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf;
}

std::int64_t payload_bytes(const at::Tensor& tensor) {
  return static_cast<std::int64_t>(tensor.numel()) * static_cast<std::int64_t>(tensor.element_size());
}

}  // namespace parallax
