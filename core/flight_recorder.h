// The flight recorder: every process keeps its last collectives (op, group, the group's
// sequence number, bytes, the training step, start and end), so that when a job fails
// each rank can say where it was. The MPI communicators record every operation; the
// engines set the step. Dumped on failure (failure_watch.h) and on SIGUSR2.
//
//   auto id = FlightRecorder::instance().begin("dp[pp=0,tp=0]", "all_reduce", 4096);
//   ...
//   FlightRecorder::instance().end(id, /*ok=*/true);
//   std::cerr << FlightRecorder::instance().dump(8);
//
// Thread-safe; a fixed ring of kCapacity entries (the oldest are overwritten), so its
// memory is bounded however long the job runs.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace parallax {

struct CollectiveRecord {
  std::uint64_t id = 0;        ///< the process's n-th recorded operation (from 1)
  std::string group;           ///< the communicator's name, e.g. "dp[pp=0,tp=0]"
  std::string op;              ///< e.g. "all_reduce"
  std::uint64_t sequence = 0;  ///< the group's n-th operation on this rank (from 1)
  std::int64_t bytes = 0;
  std::int64_t step = -1;  ///< the training step when it started (-1: before the first)
  double started_s = 0.0;  ///< seconds since the recorder was created
  double ended_s = -1.0;   ///< < 0 while pending
  bool ok = false;         ///< ended and succeeded
};

class FlightRecorder {
 public:
  static constexpr std::size_t kCapacity = 256;
  static FlightRecorder& instance();

  /// Records an operation submitted on `group`: its id (for end()), its sequence in
  /// the group and the step.
  struct Begun {
    std::uint64_t id = 0;
    std::uint64_t sequence = 0;
    std::int64_t step = -1;
  };
  Begun begin(const std::string& group, const std::string& op, std::int64_t bytes);
  /// The operation ended (`ok`: succeeded). Unknown or overwritten ids are ignored.
  void end(std::uint64_t id, bool ok);
  /// The training step the following operations belong to (the engines set it).
  void set_step(std::int64_t step);
  std::int64_t step() const;
  /// Seconds since the recorder was created (the clock of started_s and ended_s).
  double now_s() const;

  /// The recorded operations still in the ring, oldest first.
  std::vector<CollectiveRecord> recent() const;
  /// The oldest operation still pending (what this rank waits for), if any.
  std::optional<CollectiveRecord> oldest_pending() const;
  /// The last `count` operations, one line each, oldest first.
  std::string dump(std::size_t count) const;
  /// One line for `record`: "all_reduce #418 of dp[pp=0,tp=0] (4096 bytes, step 208)".
  static std::string describe(const CollectiveRecord& record);

 private:
  FlightRecorder();
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> ring_;
  std::uint64_t next_id_ = 1;
  std::map<std::string, std::uint64_t> sequences_;
  std::int64_t step_ = -1;
  double origin_s_ = 0.0;
};

}  // namespace parallax
