// The MPI world this process belongs to.
//
// World brings MPI up (with MPI_THREAD_MULTIPLE: each communicator progresses its
// operations on a thread of its own) and down, and knows this process's place: rank,
// size, node-local rank (via MPI_Comm_split_type(SHARED)) and hostname. A program
// started without mpirun is a world of one.
//
//   parallax::World world(argc, argv);         // MPI_Init_thread, or reuse an initialized MPI
//   world.communicator().all_reduce(t)->wait();
//
// If MPI was already initialized (by the application, or by an outer World), a World
// attaches to it and leaves finalization to whoever initialized it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "parallax/core/communicator.h"

namespace parallax {

/// Why a world of `mpi_size` ranks is not the job its launcher started, or "" when it
/// is (or no launcher said). The launcher's promise: OMPI_COMM_WORLD_SIZE (mpirun),
/// PMI_SIZE (Hydra), or, for a task srun started itself (SLURM_STEP_ID set),
/// SLURM_STEP_NUM_TASKS / SLURM_NTASKS. A mismatch is typically srun and the MPI library
/// not sharing a PMI, which starts every task as a world of one: training would run N
/// unrelated copies. `env` reads a variable (std::getenv; tests pass their own). Pure.
std::string launcher_size_mismatch(int mpi_size, const std::function<const char*(const char*)>& env);

class World {
 public:
  /// Initializes MPI (unless already initialized) and duplicates MPI_COMM_WORLD into the
  /// world communicator. Throws CommError if the MPI library cannot provide
  /// MPI_THREAD_MULTIPLE, UsageError (after finalizing MPI) if the world is not the one
  /// the launcher started (launcher_size_mismatch). Sets the process rank used in messages.
  World(int& argc, char**& argv);
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  /// Releases the world communicator, then meets the other ranks at a shutdown barrier
  /// (bounded by shutdown_timeout(), or kShutdownAfterFailure once the job failed) and
  /// finalizes MPI if this World initialized it. If the peers do not arrive in time (a
  /// rank died or is stopped, or is stuck in a collective after an error), it aborts the
  /// job instead of hanging in MPI_Finalize. It also starts and stops the failure channel
  /// (failure_watch.h).
  ~World();

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Rank among the processes on this node (shared-memory domain).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& hostname() const { return hostname_; }

  /// The communicator over all ranks (a duplicate of MPI_COMM_WORLD, so Parallax's
  /// traffic never matches the application's own MPI messages).
  Communicator& communicator() { return *world_comm_; }

  /// Tears the whole job down with `exit_code` (MPI_Abort). For applications that
  /// caught an error and cannot rely on the other ranks reaching MPI_Finalize:
  /// after a timed-out collective a plain return could leave peers blocked.
  [[noreturn]] static void abort(int exit_code);

  /// How long the destructor waits for the other ranks once the job has failed
  /// (failure_watch.h): every live rank has heard so by then.
  static constexpr std::chrono::milliseconds kShutdownAfterFailure{1000};
  /// How long the destructor waits for the other ranks. Default: 60 s.
  void set_shutdown_timeout(std::chrono::milliseconds timeout) { shutdown_timeout_ = timeout; }
  std::chrono::milliseconds shutdown_timeout() const { return shutdown_timeout_; }

 private:
  bool owns_mpi_ = false;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::string hostname_;
  std::chrono::milliseconds shutdown_timeout_{60'000};
  std::unique_ptr<Communicator> world_comm_;
};

}  // namespace parallax
