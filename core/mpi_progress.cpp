#include "parallax/core/mpi_progress.h"

#include <pthread.h>
#include <sched.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>

#include "parallax/core/error.h"
#include "parallax/core/failure_watch.h"
#include "parallax/core/flight_recorder.h"
#include "parallax/core/logging.h"
#include "parallax/core/mpi_datatypes.h"

namespace parallax::detail {

using Clock = std::chrono::steady_clock;

/// One submitted operation. The fields after `deadline` are guarded by shared->mutex.
/// `spec.what` and `spec.timeout` are immutable after submit; the rest of `spec` (the
/// buffers and callbacks) belongs to the progress thread.
struct MpiOpState {
  MpiOpSpec spec;
  std::shared_ptr<MpiEngineShared> shared;
  Clock::time_point submitted;
  Clock::time_point deadline;
  bool completing = false;       ///< request done; `finish` is running on the thread
  bool finished = false;         ///< succeeded or failed
  std::string error;             ///< non-empty when failed
  FlightRecorder::Begun record;  ///< its flight-recorder entry
};

namespace {

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<MpiOpState> op) : op_(std::move(op)) {}

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(op_->shared->mutex);
    return op_->finished;
  }

  void wait() override {
    MpiEngineShared& shared = *op_->shared;
    std::unique_lock<std::mutex> lock(shared.mutex);
    shared.done_cv.wait_until(lock, op_->deadline,
                              [&] { return op_->finished || op_->completing || !shared.failure.empty(); });
    // A completed request whose `finish` is still running (a division, a split) is not
    // a hang: give it a grace period rather than fail an operation that has succeeded.
    shared.done_cv.wait_until(lock, Clock::now() + MpiProgressEngine::kDefaultGrace,
                              [&] { return op_->finished || !op_->completing; });
    if (!op_->finished && !shared.failure.empty() && Clock::now() < op_->deadline) {
      shared.fail_locked(*op_, op_->spec.what + " was abandoned: " + shared.failure, /*fail_group=*/false);
    }
    if (!op_->finished) {
      shared.time_out_locked(*op_);
    }
    if (op_->error.empty()) return;
    // An operation of a group a timeout failed (this one, or one it was abandoned with):
    // who never joined is asked of every rank over the failure channel, outside the lock.
    if (!shared.timeout) throw CommError(op_->error);
    const TimeoutFacts facts = *shared.timeout;
    const std::string error = op_->error;
    lock.unlock();
    const std::string verdict = failure_watch::diagnose_timeout(
        facts, diagnosis_window(std::chrono::milliseconds(static_cast<std::int64_t>(facts.waited_s * 1000))));
    throw CommError(verdict.empty() ? error : error + "\n  " + verdict);
  }

 private:
  std::shared_ptr<MpiOpState> op_;
};

struct Active {
  std::shared_ptr<MpiOpState> op;
  MPI_Request request = MPI_REQUEST_NULL;
};

}  // namespace

std::chrono::milliseconds diagnosis_window(std::chrono::milliseconds timeout) {
  return std::clamp<std::chrono::milliseconds>(timeout / 10, std::chrono::seconds(1), std::chrono::seconds(5));
}

void MpiEngineShared::fail_locked(MpiOpState& op, const std::string& message, bool fail_group) {
  if (!op.finished) {
    op.finished = true;
    op.error = message;
    FlightRecorder::instance().end(op.record.id, /*ok=*/false);
  }
  if (fail_group) fail_group_locked(message);
  done_cv.notify_all();
  queue_cv.notify_all();
}

void MpiEngineShared::fail_group_locked(const std::string& reason) {
  if (!failure.empty()) return;  // the first failure is the reason
  failure = reason;
  for (auto& queued : queue) {
    if (!queued->finished) {
      queued->finished = true;
      queued->error = queued->spec.what + " was abandoned: " + reason;
      FlightRecorder::instance().end(queued->record.id, /*ok=*/false);
    }
  }
  queue.clear();
  done_cv.notify_all();
  queue_cv.notify_all();
}

void MpiEngineShared::hear_failure_locked(const std::string& reason) {
  if (!failure.empty() || !heard_failure.empty()) return;
  heard_failure = reason;
  settle_deadline = Clock::now() + MpiProgressEngine::kSettleGrace;
  ++wakeups;
  queue_cv.notify_all();
}

void MpiEngineShared::time_out_locked(MpiOpState& op) {
  if (op.finished) {
    return;
  }
  if (!timeout) {
    timeout = TimeoutFacts{group,
                           to_string(op.spec.op),
                           op.record.sequence,
                           op.record.step,
                           members,
                           std::chrono::duration<double>(op.spec.timeout).count()};
  }
  fail_locked(
      op,
      concat(op.spec.what, " timed out after ", op.spec.timeout.count(), " ms ", where, "; the group is now unusable"),
      /*fail_group=*/true);
}

MpiProgressEngine::MpiProgressEngine(std::string where, std::string group, std::vector<int> members, Recorder recorder)
    : shared_(std::make_shared<MpiEngineShared>()), recorder_(std::move(recorder)) {
  shared_->where = std::move(where);
  shared_->group = std::move(group);
  shared_->members = std::move(members);
  failure_callback_ =
      failure_watch::on_job_failure([weak = std::weak_ptr<MpiEngineShared>(shared_)](const std::string& reason) {
        if (const auto shared = weak.lock()) {
          std::lock_guard<std::mutex> lock(shared->mutex);
          shared->hear_failure_locked(reason);
        }
      });
  thread_ = std::thread([this] { run(); });
}

MpiProgressEngine::~MpiProgressEngine() {
  shutdown(kDefaultGrace);
}

WorkPtr MpiProgressEngine::submit(MpiOpSpec spec) {
  auto op = std::make_shared<MpiOpState>();
  // Clamp so that submit time + timeout cannot overflow the clock (1 year is forever).
  spec.timeout = std::min<std::chrono::milliseconds>(spec.timeout, std::chrono::hours(24 * 365));
  op->spec = std::move(spec);
  op->shared = shared_;
  op->submitted = Clock::now();
  op->record = FlightRecorder::instance().begin(shared_->group, to_string(op->spec.op), op->spec.bytes);
  op->deadline = op->submitted + op->spec.timeout;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    PARALLAX_CHECK(shared_->failure.empty(), CommError, op->spec.what,
                   ": the group is unusable since an earlier operation failed: ", shared_->failure);
    PARALLAX_CHECK(shared_->heard_failure.empty(), CommError, op->spec.what, " was not started: ",
                   shared_->heard_failure);
    PARALLAX_ASSERT(!shared_->stopping, "submit after shutdown");
    shared_->queue.push_back(op);
    ++shared_->wakeups;
  }
  shared_->queue_cv.notify_all();
  return std::make_shared<MpiWork>(std::move(op));
}

void MpiProgressEngine::shutdown(std::chrono::milliseconds grace) {
  if (shut_down_) {
    return;
  }
  shut_down_ = true;
  failure_watch::forget(failure_callback_);
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
    shared_->stop_deadline = Clock::now() + grace;
    ++shared_->wakeups;
  }
  shared_->queue_cv.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void MpiProgressEngine::run() {
#ifdef __linux__
  // Sleeps of a few microseconds are the point of the backoff; the default 50 µs timer
  // slack would stretch every one of them.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  pthread_setname_np(pthread_self(), "parallax-mpi");
#endif
  MpiEngineShared& s = *shared_;
  std::vector<Active> in_flight;  // started, in start order
  std::vector<Active> abandoned;  // failed while their request was still active
  std::vector<std::shared_ptr<MpiOpState>> to_start;
  int idle_polls = 0;  // sleeps since the last progress
  Clock::time_point attentive_until;

  // The Work may live on; the buffers should not. Only this thread touches these fields.
  auto release_buffers = [](MpiOpState& op) {
    op.spec.tensors.clear();
    op.spec.start = nullptr;
    op.spec.finish = nullptr;
  };

  // Runs on completion of a request: `finish`, counters, then wake the waiters.
  auto complete = [&](MpiOpState& op, const MPI_Status& status) {
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (!op.finished) {
        op.completing = true;
      }
    }
    if (!op.completing) {  // failed earlier (timed out or abandoned)
      if (op.spec.finish_if_abandoned && op.spec.finish) {
        try {
          op.spec.finish(status);
        } catch (const std::exception&) {
        }
      }
      release_buffers(op);
      return;
    }
    std::string error;
    try {
      if (op.spec.finish) {
        op.spec.finish(status);
      }
    } catch (const Error& e) {
      error = e.detail();
    } catch (const std::exception& e) {
      error = op.spec.what + " failed: " + e.what();
    }
    if (error.empty() && op.spec.counted) {
      recorder_(op.spec.op, op.spec.bytes,
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - op.submitted).count(),
                op.spec.peer);
    }
    // Before the waiters wake: a tensor whose wait() returned is no longer held here (its
    // storage would otherwise be freed on this thread, later, after an allocator or
    // accounting scope on the waiter's side ended; ASan found it).
    release_buffers(op);
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      op.completing = false;
      if (!error.empty()) {
        s.fail_locked(op, error, /*fail_group=*/false);
      } else {
        op.finished = true;
        FlightRecorder::instance().end(op.record.id, /*ok=*/true);
        s.done_cv.notify_all();
      }
    }
  };

  try {
    while (true) {
      bool progressed = false;
      to_start.clear();
      {
        std::unique_lock<std::mutex> lock(s.mutex);
        const auto now = Clock::now();
        if (s.stopping && now >= s.stop_deadline) {
          break;
        }
        // The job failed elsewhere: once what was submitted settled, or its grace ran
        // out, the group fails with that reason (protocol step d).
        if (!s.heard_failure.empty() && s.failure.empty() &&
            (now >= s.settle_deadline || (in_flight.empty() && s.queue.empty()))) {
          s.fail_group_locked(s.heard_failure);
        }
        if (in_flight.empty() && abandoned.empty() && s.queue.empty()) {
          if (s.stopping) {
            break;
          }
          s.queue_cv.wait(lock, [&] { return s.stopping || !s.queue.empty() || (!s.heard_failure.empty() && s.failure.empty());
          });
          continue;
        }
        // Queued operations held back (in-flight limit, fence) still have deadlines.
        auto expired =
            std::find_if(s.queue.begin(), s.queue.end(), [&](const auto& queued) { return now >= queued->deadline; });
        if (expired != s.queue.end()) {
          const std::shared_ptr<MpiOpState> op = *expired;  // time_out_locked clears the queue
          s.time_out_locked(*op);
        }
        bool fenced = std::any_of(in_flight.begin(), in_flight.end(), [](const Active& a) { return a.op->spec.fence; });
        while (!fenced && s.failure.empty() && !s.queue.empty() && in_flight.size() + to_start.size() < kMaxInFlight) {
          to_start.push_back(std::move(s.queue.front()));
          s.queue.pop_front();
          fenced = to_start.back()->spec.fence;
        }
      }

      for (auto& op : to_start) {
        progressed = true;
        {
          std::lock_guard<std::mutex> lock(s.mutex);
          if (!s.failure.empty()) {  // failed meanwhile: never start it
            s.fail_locked(*op, op->spec.what + " was abandoned: " + s.failure, false);
            continue;
          }
        }
        Active active{op, MPI_REQUEST_NULL};
        const int code = op->spec.start(&active.request);
        if (code != MPI_SUCCESS) {
          std::lock_guard<std::mutex> lock(s.mutex);
          s.fail_locked(*op,
                        concat(op->spec.what, " could not start: ", mpi_error_string(code), " ", s.where,
                               "; the group is now unusable"),
                        /*fail_group=*/true);
          continue;
        }
        in_flight.push_back(std::move(active));
      }

      for (std::size_t i = 0; i < in_flight.size();) {
        Active& active = in_flight[i];
        int flag = 0;
        MPI_Status status;
        const int code = MPI_Test(&active.request, &flag, &status);
        if (code != MPI_SUCCESS) {
          std::lock_guard<std::mutex> lock(s.mutex);
          s.fail_locked(*active.op,
                        concat(active.op->spec.what, " failed: ", mpi_error_string(code), " ", s.where,
                               "; the group is now unusable"),
                        /*fail_group=*/true);
        } else if (!flag) {
          ++i;
          continue;
        } else {
          complete(*active.op, status);
        }
        progressed = true;
        in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      }

      {
        std::lock_guard<std::mutex> lock(s.mutex);
        const auto now = Clock::now();
        for (Active& active : in_flight) {
          if (!active.op->finished && now >= active.op->deadline) {
            s.time_out_locked(*active.op);
          }
        }
        for (std::size_t i = 0; i < in_flight.size();) {
          MpiOpState& op = *in_flight[i].op;
          if (!op.finished && !s.failure.empty()) {
            s.fail_locked(op, op.spec.what + " was abandoned: " + s.failure, false);
          }
          if (op.finished) {  // failed while its request is active: keep the request
            abandoned.push_back(std::move(in_flight[i]));
            in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
          } else {
            ++i;
          }
        }
      }

      for (std::size_t i = 0; i < abandoned.size();) {
        int flag = 0;
        MPI_Status status;
        const int code = MPI_Test(&abandoned[i].request, &flag, &status);
        if (code == MPI_SUCCESS && !flag) {
          ++i;
          continue;
        }
        if (code == MPI_SUCCESS) {
          complete(*abandoned[i].op, status);
        }
        progressed = true;
        abandoned.erase(abandoned.begin() + static_cast<std::ptrdiff_t>(i));
      }

      if (progressed) {
        idle_polls = 0;
        std::int64_t bytes = 0;
        for (const Active& active : in_flight) {
          bytes += active.op->spec.bytes;
        }
        attentive_until =
            Clock::now() + MpiProgressEngine::kAttentiveBase + MpiProgressEngine::kAttentivePerByte * bytes;
      } else if (Clock::now() < attentive_until) {
        sched_yield();
      } else {
        const int doublings = std::min(idle_polls, 16);
        const auto sleep = std::min<std::chrono::microseconds>(std::chrono::microseconds(std::int64_t{1} << doublings),
                                                               MpiProgressEngine::kMaxSleep);
        ++idle_polls;
        std::unique_lock<std::mutex> lock(s.mutex);
        const std::uint64_t seen = s.wakeups;
        s.queue_cv.wait_for(lock, sleep, [&] { return s.wakeups != seen; });
      }
    }
  } catch (const std::exception& e) {
    Logger(LogLevel::kError).error("MPI progress thread stopped by an unexpected error: ", e.what());
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.failure.empty()) {
      s.failure = std::string("the progress thread failed: ") + e.what();
    }
  }

  // Stopped: fail whatever is left and leak the requests (and the buffers they use)
  // that never completed. MPI offers no way to free them safely.
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::string reason = "the communicator was destroyed before it completed";
  for (auto& queued : s.queue) {
    s.fail_locked(*queued, queued->spec.what + ": " + reason, false);
  }
  s.queue.clear();
  for (Active& active : in_flight) {
    s.fail_locked(*active.op, active.op->spec.what + ": " + reason, false);
  }
  leaked_ = in_flight.size() + abandoned.size();
  if (leaked_ > 0) {
    auto* kept = new std::vector<at::Tensor>();  // intentionally leaked, see above
    for (auto* list : {&in_flight, &abandoned}) {
      for (Active& active : *list) {
        for (auto& tensor : active.op->spec.tensors) {
          kept->push_back(tensor);
        }
      }
    }
    Logger(LogLevel::kWarn)
        .warn("leaking ", leaked_, " MPI request(s) still active at shutdown ", s.where,
              " (a peer never joined them); their communicator, ", kept->size(),
              " buffer(s) and reduction ops are leaked too");
  }
  s.done_cv.notify_all();
}

}  // namespace parallax::detail
