// The communicator: the only way Parallax modules talk to other ranks.
//
// A Communicator is one group of ranks (the world, a data-parallel group, a
// tensor-parallel group, a pipeline pair). Every operation is asynchronous: it is
// enqueued in call order, returns a `Work`, and the caller waits on it. All ranks of
// the group must issue the same collectives in the same order (as with MPI/NCCL).
//
// Every operation has a timeout (per call, or the communicator's default, which comes
// from `[comm] timeout_s`). A wait that passes it throws CommError naming the op,
// the group, the payload size and the rank, and the communicator is marked failed:
// every later operation on it throws at once instead of hanging.
//
// Every call is counted (calls, logical bytes, time) per op kind, and how many of those
// bytes reached another node; tests hold those counters against theory, and the metrics
// file reports them per step.
//
//   auto work = comm.all_reduce(grads);   // returns at once
//   ...                                   // overlap other work
//   work->wait();                          // blocks; throws CommError on timeout
//
// Backends: MpiCommunicator (host tensors; always built) and NcclCommunicator (CUDA
// tensors; built with PARALLAX_WITH_NCCL). Create them with the factory functions in
// mpi_communicator.h / nccl_communicator.h, or let the Mesh create them. A group that
// carries both kinds routes each tensor to one of them (device_routed_communicator.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace parallax {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

/// The operation kinds, used to index counters. Names match the method names.
enum class CommOp { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv, kBarrier, kAllToAll };
constexpr std::size_t kCommOpCount = 8;
/// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier",
/// "all_to_all".
const char* to_string(CommOp op);

/// Per-call options. A timeout of zero means the communicator's default.
struct CollectiveOptions {
  ReduceOp reduce_op = ReduceOp::kSum;
  std::chrono::milliseconds timeout{0};
};

/// Counters for one op kind. `bytes` is the logical payload: the whole buffer for
/// all_reduce and broadcast, the unsharded (full) size for reduce_scatter and
/// all_gather, the message for send/recv, 0 for barrier, and for all_to_all what this
/// rank sends to the other ranks (its own chunk stays, and is not counted).
struct OpCounter {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  std::int64_t nanoseconds = 0;  ///< enqueue to completion, as seen by the backend
  /// The part of `bytes` whose operations reached another node: a send or recv whose peer
  /// is on another node, a collective over a group whose ranks span nodes (its whole
  /// payload: which of it the MPI library's algorithm moves across is the library's).
  /// 0 for a group whose nodes were never set (set_member_nodes).
  std::int64_t inter_node_bytes = 0;
};

/// A snapshot of all counters of one communicator.
struct CommCounters {
  std::array<OpCounter, kCommOpCount> ops{};

  const OpCounter& operator[](CommOp op) const { return ops[static_cast<std::size_t>(op)]; }
  OpCounter& operator[](CommOp op) { return ops[static_cast<std::size_t>(op)]; }
  /// Element-wise difference (this - earlier): the activity between two snapshots.
  CommCounters since(const CommCounters& earlier) const;
  /// Element-wise sum, for totals over several communicators.
  CommCounters& operator+=(const CommCounters& other);
};

/// Handle to an enqueued operation.
class Work {
 public:
  virtual ~Work() = default;
  /// True once the operation finished (successfully or not). Never blocks.
  virtual bool is_completed() = 0;
  /// Blocks until the operation completes. Throws CommError if it failed or did not
  /// complete within its timeout. Calling wait again after success returns at once.
  virtual void wait() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This process's rank within the group, 0 ≤ rank < size.
  virtual int rank() const = 0;
  /// Number of ranks in the group.
  virtual int size() const = 0;
  /// The group's name, used in errors and counters (e.g. "world", "dp[tp=0,pp=1]").
  virtual const std::string& name() const = 0;
  /// The backend's name: "mpi" or "nccl".
  virtual const char* backend() const = 0;

  /// In-place reduction of `tensor` across the group. kAvg divides by size().
  virtual WorkPtr all_reduce(at::Tensor& tensor, const CollectiveOptions& options = {}) = 0;

  /// `input` holds size() equal contiguous chunks; rank r receives the reduction of
  /// chunk r from every rank in `output`. Requires input.numel() == size() * output.numel().
  virtual WorkPtr reduce_scatter(at::Tensor& output,
                                 const at::Tensor& input,
                                 const CollectiveOptions& options = {}) = 0;

  /// Rank r's `input` lands in chunk r of `output`.
  /// Requires output.numel() == size() * input.numel().
  virtual WorkPtr all_gather(at::Tensor& output, const at::Tensor& input, const CollectiveOptions& options = {}) = 0;

  /// Copies `root`'s tensor into every rank's `tensor`.
  virtual WorkPtr broadcast(at::Tensor& tensor, int root, const CollectiveOptions& options = {}) = 0;

  /// Point-to-point. Tags let several messages between the same pair be in flight.
  virtual WorkPtr send(const at::Tensor& tensor, int dst, int tag, const CollectiveOptions& options = {}) = 0;
  virtual WorkPtr recv(at::Tensor& tensor, int src, int tag, const CollectiveOptions& options = {}) = 0;

  virtual WorkPtr barrier(const CollectiveOptions& options = {}) = 0;

  /// Personalized exchange along dim 0 (MPI_Alltoallv; grouped send/receive on NCCL):
  /// `input`'s rows are size() consecutive chunks, chunk q (input_rows[q] rows) going to
  /// rank q, and `output` receives rank q's chunk for this rank (output_rows[q] rows) as
  /// its q-th chunk. Both tensors share dtype and the shape past dim 0; the row counts
  /// must sum to their first dimensions, and each pair of ranks must agree on what they
  /// exchange (exchange the counts first, e.g. with an all_to_all of one int64 per rank).
  virtual WorkPtr all_to_all(at::Tensor& output,
                             const std::vector<std::int64_t>& output_rows,
                             const at::Tensor& input,
                             const std::vector<std::int64_t>& input_rows,
                             const CollectiveOptions& options = {}) = 0;

  /// Collective over this group: ranks passing the same `color` form a new
  /// communicator, ordered by `key` (ties by rank). `name` names the new group.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  /// A consistent copy of this communicator's counters. Thread-safe.
  virtual CommCounters counters() const;

  /// The node (an index into the Cluster) of each rank of this group, by group rank, so
  /// the counters split traffic into intra- and inter-node (OpCounter::inter_node_bytes).
  /// Whoever knows the cluster sets it once, before the group's first operation (the Mesh
  /// for the world and its groups). Until then every byte counts as intra-node. Throws
  /// UsageError for a list whose size is not size().
  virtual void set_member_nodes(std::vector<int> nodes);
  /// The nodes set_member_nodes gave (empty when never set).
  const std::vector<int>& member_nodes() const { return member_nodes_; }
  /// True when the group's ranks are on more than one node.
  bool spans_nodes() const { return spans_nodes_; }

  /// The training step that error messages of later operations name ("at step 12"),
  /// so a timeout says where in training it happened; -1 (the default) names none.
  /// The engine sets it at the start of each optimizer step. Thread-safe.
  void set_step(std::int64_t step) { step_.store(step); }
  std::int64_t step() const { return step_.load(); }

  /// The timeout used when CollectiveOptions::timeout is zero. Thread-safe.
  /// Default: 300 s (`[comm] timeout_s`). split() passes it on to the new group.
  void set_default_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds default_timeout() const;

 protected:
  /// The timeout that applies to one call: its own, or the default.
  std::chrono::milliseconds timeout_for(const CollectiveOptions& options) const;

  // Argument checks every backend applies the same way. Each throws UsageError whose
  // message starts with error_prefix(op); a failed check leaves the group usable.

  /// "all_reduce on group 'dp[tp=0,pp=0]': ".
  std::string error_prefix(CommOp op) const;
  /// "all_reduce on group 'dp' (4 ranks, 4096 bytes, float32) at step 12": how
  /// backends name an operation in errors.
  std::string describe_op(CommOp op, const at::Tensor& tensor, std::int64_t bytes) const;
  /// " at step 12", or "" when no step is set.
  std::string step_suffix() const;
  void check_same_dtype(CommOp op, const at::Tensor& output, const at::Tensor& input) const;
  /// kAvg needs a floating-point tensor.
  void check_reduce_op(CommOp op, const at::Tensor& tensor, ReduceOp reduce) const;
  /// `full` (named `full_role`) must hold size() × shard.numel() elements.
  void check_shards(
      CommOp op, const at::Tensor& full, const char* full_role, const at::Tensor& shard, const char* shard_role) const;
  /// 0 ≤ peer < size().
  void check_peer(CommOp op, int peer, const char* role) const;
  /// all_to_all's arguments: one row count per rank, none negative, summing to each
  /// tensor's first dimension; the same dtype and row shape. Returns the elements per row.
  std::int64_t check_all_to_all(const at::Tensor& output,
                                const std::vector<std::int64_t>& output_rows,
                                const at::Tensor& input,
                                const std::vector<std::int64_t>& input_rows) const;

  /// Backends call this once per operation when it completes; `peer` is a send's
  /// destination or a recv's source (group rank), -1 for a collective.
  void record(CommOp op, std::int64_t bytes, std::int64_t nanoseconds, int peer);

 private:
  mutable std::mutex counters_mutex_;
  CommCounters counters_;
  std::vector<int> member_nodes_;
  bool spans_nodes_ = false;
  std::atomic<std::int64_t> default_timeout_ms_{300'000};
  std::atomic<std::int64_t> step_{-1};
};

/// Tensor payload in bytes (numel × element size).
std::int64_t payload_bytes(const at::Tensor& tensor);

/// Collective over `comm`: every rank contributes `value` (a hash, a count); returns,
/// on every rank, the ranks whose value differs from rank 0's (empty when all agree).
/// Blocks; throws CommError on a failed or timed-out exchange.
std::vector<int> ranks_differing_from_root(Communicator& comm, std::uint64_t value);

/// Collective over `comm`: every rank's `value`, by rank, on every rank (two all-gathers:
/// the lengths, then the bytes padded to the longest). Blocks; throws CommError on failure.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& value);

/// Collective over `comm`: runs `action` on every rank, then agrees on the outcome. A
/// rank whose action threw a parallax::Error rethrows it; the others throw UsageError
/// ("<what> failed on N other rank(s); see their messages"). So a failure on some ranks
/// (a file, a node's hwloc, one pipeline stage's layers) never leaves the others waiting
/// in a later collective. Blocks; throws CommError on a failed exchange.
void run_everywhere(Communicator& comm, const char* what, const std::function<void()>& action);

/// Collective over `comm`: sums `tensors` (same dtype and device; any shapes) over the
/// group in place, as one flat all-reduce. Blocks; throws CommError on failure.
void sum_in_place(Communicator& comm, const std::vector<at::Tensor>& tensors);

/// "float32", "bfloat16", "int64", ...: the names used in messages and counters.
const char* dtype_name(at::ScalarType dtype);
/// True for float32, float64, bfloat16 and float16: the dtypes kAvg accepts.
bool is_floating_dtype(at::ScalarType dtype);

}  // namespace parallax
