#include "parallax/core/failure_watch.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "parallax/core/error.h"
#include "parallax/core/flight_recorder.h"
#include "proto/failure.pb.h"

namespace parallax::failure_watch {
namespace {

constexpr int kTag = 4242;
constexpr std::chrono::milliseconds kPoll{10};  // an idle listener: 100 probes a second

std::atomic<bool> g_job_failed{false};
std::atomic<bool> g_dump_requested{false};

void on_dump_signal(int) {
  g_dump_requested.store(true);
}

// The callbacks that fail the communicators' pending operations.
struct Callbacks {
  std::mutex mutex;
  std::uint64_t next = 1;
  std::map<std::uint64_t, std::function<void(const std::string&)>> by_id;
};
Callbacks& callbacks() {
  static Callbacks* registry = new Callbacks();  // outlives every communicator
  return *registry;
}

void fail_everything(const std::string& reason) {
  {
    Callbacks& c = callbacks();
    std::lock_guard<std::mutex> lock(c.mutex);
    for (auto& [id, fail] : c.by_id) fail(reason);
  }
  // After the groups heard: whoever sees job_failed() finds them refusing new work.
  mark_job_failed();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i == 0 ? "" : ", ") << ranks[i];
  return out.str();
}

struct Sent {
  std::string bytes;
  MPI_Request request = MPI_REQUEST_NULL;
};

class Watch {
 public:
  Watch() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    listener_ = std::thread([this] { listen(); });
  }

  ~Watch() {
    running_.store(false);
    listener_.join();
    // Sends still in flight (to a rank that died or stopped) keep their buffers and the
    // channel until the job ends: MPI may still read them.
    bool all_done = true;
    for (Sent& sent : *sent_) {
      int done = 0;
      MPI_Test(&sent.request, &done, MPI_STATUS_IGNORE);
      all_done = all_done && done;
    }
    if (all_done) {
      MPI_Comm_free(&comm_);
    } else {
      (void)sent_.release();
    }
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  void send_to_all(const proto::FailureNotice& notice) {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) send(notice, r);
    }
  }

  std::string diagnose(const TimeoutFacts& facts, std::chrono::milliseconds window) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!verdict_.empty()) return verdict_;
      if (diagnosing_) {  // another thread of this rank asks already: take its answer
        cv_.wait_for(lock, window * 2, [&] { return !verdict_.empty(); });
        return verdict_;
      }
      diagnosing_ = true;
      answers_.clear();
    }
    mark_job_failed();
    proto::FailureNotice ask;
    ask.set_kind(proto::FailureNotice::WHERE_ARE_YOU);
    ask.set_rank(rank_);
    send_to_all(ask);
    std::map<int, proto::FailureNotice> answers;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, window, [&] { return static_cast<int>(answers_.size()) >= size_ - 1 || !verdict_.empty(); });
      for (const proto::FailureNotice& answer : answers_) answers[answer.rank()] = answer;
      if (!verdict_.empty()) return verdict_;  // another rank's diagnosis came first
    }
    const std::string verdict = compose(facts, answers);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (verdict_.empty()) verdict_ = verdict;
    }
    proto::FailureNotice told;
    told.set_kind(proto::FailureNotice::VERDICT);
    told.set_rank(rank_);
    told.set_text(verdict);
    send_to_all(told);
    fail_everything(verdict);
    return verdict;
  }

 private:
  // Who never joined the operation, from the answers (see the header's example).
  std::string compose(const TimeoutFacts& facts, const std::map<int, proto::FailureNotice>& answers) const {
    const std::set<int> members(facts.members.begin(), facts.members.end());
    std::vector<int> waiting = {rank_};
    std::vector<int> silent_members;
    std::vector<int> silent_others;
    std::vector<std::string> elsewhere;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const auto found = answers.find(r);
      if (found == answers.end()) {
        (members.count(r) ? silent_members : silent_others).push_back(r);
        continue;
      }
      if (!members.count(r)) continue;
      const proto::FailureNotice& here = found->second;
      if (here.pending() && here.group() == facts.group && here.sequence() == facts.sequence) {
        waiting.push_back(r);
      } else if (here.pending()) {
        elsewhere.push_back("rank " + std::to_string(r) + " was in " + here.operation());
      } else {
        elsewhere.push_back("rank " + std::to_string(r) + " was in no collective (last: " + here.operation() + ")");
      }
    }
    std::sort(waiting.begin(), waiting.end());
    std::ostringstream operation;
    operation << facts.op << " #" << facts.sequence << " of " << facts.group;
    if (facts.step >= 0) operation << " (step " << facts.step << ")";
    std::ostringstream line;
    if (!silent_members.empty()) {
      line << rank_list(silent_members) << " never joined " << operation.str()
           << " and did not answer (stopped, dead or hung)";
      if (!elsewhere.empty()) line << "; ";
    } else if (elsewhere.empty()) {
      line << "every rank of " << facts.group << " answered, but " << operation.str() << " did not complete";
    } else {
      line << operation.str() << " was not joined: ";
    }
    for (std::size_t i = 0; i < elsewhere.size(); ++i) line << (i ? "; " : "") << elsewhere[i];
    char waited[32];
    std::snprintf(waited, sizeof(waited), "%.1f", facts.waited_s);
    line << "; " << rank_list(waiting) << " waited " << waited << " s in it";
    if (!silent_others.empty())
      line << "; " << rank_list(silent_others) << " (outside the group) did not answer either";
    return line.str();
  }

  void send(const proto::FailureNotice& notice, int to) {
    std::lock_guard<std::mutex> lock(send_mutex_);
    sent_->push_back(Sent{notice.SerializeAsString(), MPI_REQUEST_NULL});
    Sent& sent = sent_->back();
    MPI_Isend(sent.bytes.data(), static_cast<int>(sent.bytes.size()), MPI_BYTE, to, kTag, comm_, &sent.request);
  }

  void listen() {
    while (running_.load()) {
      if (g_dump_requested.exchange(false)) {
        std::fprintf(stderr, "%sflight recorder (last 32 operations):\n%s", rank_prefix().c_str(),
                     FlightRecorder::instance().dump(32).c_str());
      }
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, &status) != MPI_SUCCESS || !flag) {
        std::this_thread::sleep_for(kPoll);
        continue;
      }
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      std::string bytes(static_cast<std::size_t>(std::max(count, 0)), '\0');
      MPI_Recv(bytes.data(), count, MPI_BYTE, status.MPI_SOURCE, kTag, comm_, MPI_STATUS_IGNORE);
      proto::FailureNotice notice;
      if (!notice.ParseFromString(bytes)) continue;
      // MPI says who sent it: a malformed rank field must not aim a reply outside the job.
      notice.set_rank(status.MPI_SOURCE);
      handle(notice);
    }
  }

  void handle(const proto::FailureNotice& notice) {
    switch (notice.kind()) {
      case proto::FailureNotice::WHERE_ARE_YOU: {
        proto::FailureNotice here;
        here.set_kind(proto::FailureNotice::HERE);
        here.set_rank(rank_);
        const FlightRecorder& recorder = FlightRecorder::instance();
        here.set_step(recorder.step());
        // Where this rank waits: its oldest pending operation, or the last one when that
        // failed (it waited there until its own timeout).
        std::optional<CollectiveRecord> at = recorder.oldest_pending();
        const std::vector<CollectiveRecord> all = recorder.recent();
        if (!at && !all.empty() && !all.back().ok) at = all.back();
        if (at) {
          here.set_pending(true);
          here.set_operation(FlightRecorder::describe(*at));
          here.set_group(at->group);
          here.set_op(at->op);
          here.set_sequence(at->sequence);
          here.set_waiting_s(recorder.now_s() - at->started_s);
        } else {
          here.set_operation(all.empty() ? "none" : FlightRecorder::describe(all.back()));
        }
        send(here, notice.rank());
        break;
      }
      case proto::FailureNotice::HERE: {
        std::lock_guard<std::mutex> lock(mutex_);
        answers_.push_back(notice);
        cv_.notify_all();
        break;
      }
      case proto::FailureNotice::VERDICT:
      case proto::FailureNotice::FAILED: {
        const std::string reason = notice.kind() == proto::FailureNotice::VERDICT
                                       ? notice.text()
                                       : "rank " + std::to_string(notice.rank()) + " failed: " + notice.text();
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (!verdict_.empty()) break;
          verdict_ = reason;
          cv_.notify_all();
        }
        fail_everything(reason);
        break;
      }
      default:
        break;
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<bool> running_{true};
  std::thread listener_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<proto::FailureNotice> answers_;
  std::string verdict_;
  bool diagnosing_ = false;
  std::mutex send_mutex_;
  /// Sends made (a deque keeps each buffer where MPI was told it is).
  std::unique_ptr<std::deque<Sent>> sent_ = std::make_unique<std::deque<Sent>>();
};

std::mutex g_watch_mutex;
std::unique_ptr<Watch> g_watch;
std::atomic<bool> g_announced{false};

}  // namespace

void start() {
  std::lock_guard<std::mutex> lock(g_watch_mutex);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (g_watch || size < 2) return;
  g_watch = std::make_unique<Watch>();
  std::signal(SIGUSR2, on_dump_signal);
}

void stop() {
  std::lock_guard<std::mutex> lock(g_watch_mutex);
  g_watch.reset();
}

bool job_failed() {
  return g_job_failed.load();
}

void mark_job_failed() {
  g_job_failed.store(true);
}

void announce_failure(const std::string& message) {
  if (job_failed() || g_announced.exchange(true)) return;  // a failure heard, or told already
  mark_job_failed();
  std::lock_guard<std::mutex> lock(g_watch_mutex);
  if (!g_watch) return;
  proto::FailureNotice notice;
  notice.set_kind(proto::FailureNotice::FAILED);
  notice.set_rank(g_watch->rank());
  notice.set_text(message);
  g_watch->send_to_all(notice);
}

std::string diagnose_timeout(const TimeoutFacts& facts, std::chrono::milliseconds window) {
  Watch* watch = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_watch_mutex);
    watch = g_watch.get();
  }
  if (watch == nullptr) return "";
  return watch->diagnose(facts, window);
}

std::uint64_t on_job_failure(std::function<void(const std::string& reason)> fail_pending) {
  Callbacks& c = callbacks();
  std::lock_guard<std::mutex> lock(c.mutex);
  const std::uint64_t id = c.next++;
  c.by_id.emplace(id, std::move(fail_pending));
  return id;
}

void forget(std::uint64_t id) {
  Callbacks& c = callbacks();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.by_id.erase(id);
}

}  // namespace parallax::failure_watch
