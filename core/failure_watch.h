// The failure channel: when a rank fails, every live rank learns who failed and where
// each rank was, over a communicator that no training group uses (a duplicate of
// MPI_COMM_WORLD that World makes), listened to by one thread per rank.
//
//  - A rank whose collective times out asks every rank where it is (WHERE_ARE_YOU);
//    each live rank's listener answers with its oldest pending operation from the
//    flight recorder (HERE). After a short window the asking rank names the ranks that
//    never joined the operation (those that did not answer are stopped, dead or hung),
//    prints one line, and sends it to every rank (VERDICT):
//      rank 2 never joined all_reduce #418 of dp[...] (step 208) and did not answer
//      (stopped, dead or hung); ranks 0, 1, 3 waited 10.0 s in it
//  - A rank that fails with an error of its own tells the others (FAILED).
//  - A rank that hears a VERDICT or a FAILED prints it once, tells its groups (which
//    refuse new operations and fail their pending ones once these have had a short
//    grace to complete: mpi_progress.h, step d) and marks the job failed, so it stops
//    waiting within that grace instead of at its own timeout; its shutdown then takes a
//    short grace, not the full one.
//  - SIGUSR2 dumps this rank's flight recorder to stderr.
// Everything is best effort: a message to a dead rank is never waited for.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace parallax {

/// What a rank knows about its own timed-out operation.
struct TimeoutFacts {
  std::string group;           ///< the communicator's name
  std::string op;              ///< e.g. "all_reduce"
  std::uint64_t sequence = 0;  ///< its flight-recorder sequence number in the group
  std::int64_t step = -1;
  std::vector<int> members;  ///< the group's world ranks
  double waited_s = 0.0;
};

namespace failure_watch {

/// Starts the listener over a duplicate of MPI_COMM_WORLD (parallax::init; a world of
/// one has none). Collective over MPI_COMM_WORLD. Until it starts, a timeout fails only
/// its own group (what a bare World and its communicators do).
void start();
/// Stops the listener and frees the channel (World's destructor, before finalizing).
void stop();

/// Whether this rank has seen the job fail: a collective timed out here, or another rank
/// said it failed. Shutdown is then short.
bool job_failed();
void mark_job_failed();

/// Tells every other rank that this one failed with `message` (report_error). Does not
/// wait. Once per process.
void announce_failure(const std::string& message);

/// A collective timed out here: asks every rank where it is, waits up to `window` for
/// the answers, and returns the verdict line (also printed and sent to every rank).
/// When a verdict was already reached (here or heard), returns it at once. Without a
/// listener (not started, or a world of one) returns "".
std::string diagnose_timeout(const TimeoutFacts& facts, std::chrono::milliseconds window);

/// How the MPI communicators fail their pending operations when the job fails: each
/// registers a callback taking the reason (and unregisters it, by the returned id, before
/// it goes away).
std::uint64_t on_job_failure(std::function<void(const std::string& reason)> fail_pending);
void forget(std::uint64_t id);

}  // namespace failure_watch
}  // namespace parallax
