// The progress engine behind MpiCommunicator: one queue and one thread per
// communicator. Internal to parallax_comm (not installed).
//
// Protocol (what keeps all ranks in step and no rank hanging):
//   a. submit() appends an operation to the queue in call order and returns its Work.
//      Since every rank calls its collectives in the same order, every rank's thread
//      starts them in the same order too, which is what MPI requires.
//   b. The thread starts queued operations with their nonblocking MPI call, keeping up
//      to kMaxInFlight in flight, and polls all of them with MPI_Test (which is also
//      what drives Open MPI's progress). A "fence" operation (split) lets nothing start
//      after it until it has finished.
//   c. Between polls that achieved nothing the thread backs off. While the data in
//      flight could still be moving (for kAttentiveBase + kAttentivePerByte × bytes in
//      flight after the last start or completion) it only sched_yields: Open MPI moves
//      a large message fragment by fragment, each needing a poll, so sleeping there
//      halves the bandwidth. Past that window the operation is waiting for a peer and
//      the thread sleeps, 1 µs growing to kMaxSleep, waking early when a new operation
//      arrives. The yielding window gives the core to any runnable thread (backward
//      compute), but it is not free: about 1 ms + 8 ns per byte in flight (~200 ms for
//      a 25 MiB bucket) of polling per start or completion. It never spins without
//      yielding: tests run 4 ranks on 2 cores.
//   d. Each operation has a deadline (submit time + timeout). When it passes, the
//      thread or the waiting caller, whichever notices first, fails the operation with
//      a CommError naming op, group, bytes and rank, and marks the group failed: every
//      other pending operation fails and every later submit() throws at once. The
//      waiting caller then asks the other ranks where they are (failure_watch.h) and
//      adds the verdict, who never joined, to its error. Every operation is in the
//      flight recorder (flight_recorder.h) from submit to its end. When the job fails
//      elsewhere, every group fails with that reason, later submits throw at once, and
//      the operations already submitted get kSettleGrace to complete first: the rank
//      that failed may have finished them (it failed just after a collective that this
//      rank, slower, is still completing), and failing them would replace this rank's
//      own report with a relayed one.
//   e. MPI forbids freeing an active collective request, so the requests of failed
//      operations are kept, together with the tensors they read and write, and polled
//      until they complete (a late peer may still match them).
//   f. Shutdown starts what is queued, polls everything for a bounded grace period,
//      then fails what is left and leaks its requests with a warning. It never hangs.
#pragma once

#include <mpi.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/failure_watch.h"

namespace parallax::detail {

/// One operation as the communicator describes it to the engine.
struct MpiOpSpec {
  CommOp op = CommOp::kBarrier;
  /// "all_reduce on group 'world' (4 ranks, 4096 bytes, float32)": used in errors.
  std::string what;
  /// Logical payload for the counters (see OpCounter); counted only if `counted`.
  std::int64_t bytes = 0;
  bool counted = true;
  /// A send's destination or a recv's source (group rank), -1 for a collective: whether
  /// the bytes reached another node (Communicator::record).
  int peer = -1;
  std::chrono::milliseconds timeout{0};
  /// Nothing submitted later starts before this operation has finished (for split,
  /// whose blocking MPI_Comm_split runs in `finish`).
  bool fence = false;
  /// Run `finish` even when the operation had already failed (timed out) by the time
  /// its request completed: split must still call MPI_Comm_split then, because the
  /// peers that matched its barrier will.
  bool finish_if_abandoned = false;
  /// Buffers the request reads or writes; kept alive until the request completes.
  std::vector<at::Tensor> tensors;
  /// Starts the nonblocking call; returns an MPI error code. Runs on the progress thread.
  std::function<int(MPI_Request*)> start;
  /// Runs on the progress thread after the request completed (divide for kAvg, check a
  /// received count, ...). Throws CommError to fail the operation. May be empty.
  std::function<void(const MPI_Status&)> finish;
};

struct MpiOpState;

/// How long a rank whose operation timed out waits for the other ranks' answers before
/// it names who never joined: a tenth of the timeout, within [1 s, 5 s].
std::chrono::milliseconds diagnosis_window(std::chrono::milliseconds timeout);

/// Shared by the engine, its thread and every Work it handed out (a Work may outlive
/// the communicator).
struct MpiEngineShared {
  std::mutex mutex;
  std::condition_variable done_cv;   ///< an operation finished or failed
  std::condition_variable queue_cv;  ///< work for the thread, or stop
  std::deque<std::shared_ptr<MpiOpState>> queue;
  bool stopping = false;
  std::uint64_t wakeups = 0;  ///< bumped by submit and shutdown: ends the thread's sleep
  std::chrono::steady_clock::time_point stop_deadline;
  /// Non-empty once the group is unusable: the reason (the first timeout or error).
  std::string failure;
  /// "on rank 1 (world rank 3, host node07)": appended to timeout messages.
  std::string where;
  /// The communicator's name and its ranks' world ranks (the flight recorder's group,
  /// and who a timeout's diagnosis expects in it).
  std::string group;
  std::vector<int> members;
  /// The operation whose timeout failed the group, as its waiters (and those of every
  /// operation abandoned with it) report it to the diagnosis; empty until then.
  std::optional<TimeoutFacts> timeout;
  /// The job's failure elsewhere, heard but not yet applied (protocol step d): the
  /// operations already submitted may complete until `settle_deadline`, then the group
  /// fails with it. Empty until heard.
  std::string heard_failure;
  std::chrono::steady_clock::time_point settle_deadline;

  /// Fails `op` with a timeout and the group with it. Caller holds `mutex`.
  void time_out_locked(MpiOpState& op);
  /// Fails `op` with `message`; with `fail_group`, later submits throw. Holds `mutex`.
  void fail_locked(MpiOpState& op, const std::string& message, bool fail_group);
  /// Fails the group with `reason` (the first reason wins): fails the queued operations
  /// and wakes the waiters of those in flight, which fail theirs; later submits throw.
  /// Holds `mutex`.
  void fail_group_locked(const std::string& reason);
  /// How the job's failure elsewhere reaches the group (failure_watch.h): later submits
  /// throw, what was submitted settles (protocol step d). Holds `mutex`.
  void hear_failure_locked(const std::string& reason);
};

class MpiProgressEngine {
 public:
  /// (op, bytes, nanoseconds): called on the progress thread for each completed,
  /// counted operation, before its Work reports completion.
  using Recorder = std::function<void(CommOp, std::int64_t, std::int64_t, int)>;

  static constexpr std::size_t kMaxInFlight = 32;
  static constexpr std::chrono::microseconds kMaxSleep{128};
  /// The yield-only window of step c: at least 1 ms, plus 8 ns per byte in flight
  /// (i.e. an operation moving at ≥ 125 MB/s is polled without sleeping).
  static constexpr std::chrono::microseconds kAttentiveBase{1000};
  static constexpr std::chrono::nanoseconds kAttentivePerByte{8};

  /// Starts the thread. `where` locates this rank in errors, `group` and `members` name
  /// the communicator and its world ranks (see MpiEngineShared).
  MpiProgressEngine(std::string where, std::string group, std::vector<int> members, Recorder recorder);
  /// Calls shutdown(kDefaultGrace) if not done yet.
  ~MpiProgressEngine();
  MpiProgressEngine(const MpiProgressEngine&) = delete;
  MpiProgressEngine& operator=(const MpiProgressEngine&) = delete;

  /// Queues `spec`. Throws CommError at once if the group has failed.
  WorkPtr submit(MpiOpSpec spec);

  /// Stops the thread after at most `grace` (see protocol step f). Idempotent.
  void shutdown(std::chrono::milliseconds grace);
  static constexpr std::chrono::milliseconds kDefaultGrace{5000};
  /// How long operations submitted before the job's failure was heard may still complete
  /// (protocol step d): ample for local progress on an oversubscribed host, short beside
  /// World's kShutdownAfterFailure, which the rank that failed waits for the others.
  static constexpr std::chrono::milliseconds kSettleGrace{250};

  /// After shutdown: requests that never completed and were leaked. When non-zero,
  /// the MPI communicator and ops they use must be leaked too.
  std::size_t leaked() const { return leaked_; }

 private:
  void run();

  std::shared_ptr<MpiEngineShared> shared_;
  Recorder recorder_;
  std::uint64_t failure_callback_ = 0;  ///< failure_watch's registration
  std::thread thread_;
  std::size_t leaked_ = 0;
  bool shut_down_ = false;
};

}  // namespace parallax::detail
