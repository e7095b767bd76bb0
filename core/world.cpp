#include "parallax/core/world.h"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "parallax/core/error.h"
#include "parallax/core/failure_watch.h"
#include "parallax/core/mpi_communicator.h"

namespace parallax {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

}  // namespace

std::string launcher_size_mismatch(int mpi_size, const std::function<const char*(const char*)>& env) {
  // The launcher that started this process, and the world size it promised. mpirun's
  // ranks carry OMPI_COMM_WORLD_SIZE, Hydra's PMI_SIZE; a task that srun started itself
  // carries SLURM_STEP_ID (the batch script's own step has none), and its step's size.
  const char* variable = nullptr;
  const char* value = nullptr;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if ((value = env(name)) != nullptr) {
      variable = name;
      break;
    }
  }
  const bool srun_task = env("SLURM_STEP_ID") != nullptr;
  if (variable == nullptr && srun_task) {
    for (const char* name : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) {
      if ((value = env(name)) != nullptr) {
        variable = name;
        break;
      }
    }
  }
  if (variable == nullptr) return "";
  char* end = nullptr;
  const long promised = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || promised == mpi_size) return "";
  std::string message = std::string("the launcher started ") + value + " process(es) (" + variable + "=" + value +
                        ") but MPI joined " + std::to_string(mpi_size) + " of them into this world";
  if (srun_task && std::string(variable).rfind("SLURM_", 0) == 0) {
    message +=
        ": srun and the MPI library did not agree on a process-management interface, so each task started as "
        "a world of its own. Launch with the interface this MPI supports (Debian's Open MPI: srun --mpi=pmix; "
        "`srun --mpi=list` shows Slurm's), or under mpirun";
  } else {
    message += ": every process of a job must join one world; check the launcher's command line";
  }
  return message;
}

World::World(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    owns_mpi_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  set_process_rank(rank_);
  const std::string mismatch = launcher_size_mismatch(size_, [](const char* name) { return std::getenv(name); });
  if (!mismatch.empty()) {
    if (owns_mpi_) MPI_Finalize();
    throw UsageError(mismatch);
  }
  PARALLAX_CHECK(provided >= MPI_THREAD_MULTIPLE, CommError, "the MPI library provides ", thread_level_name(provided),
                 " but Parallax needs MPI_THREAD_MULTIPLE (each communicator progresses its "
                 "operations on its own thread); use an MPI built with thread support");

  MPI_Comm node_comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm),
            "MPI_Comm_split_type");
  MPI_Comm_rank(node_comm, &local_rank_);
  MPI_Comm_size(node_comm, &local_size_);
  MPI_Comm_free(&node_comm);

  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  hostname_.assign(host, static_cast<std::size_t>(length));

  world_comm_ = create_mpi_world_communicator();
}

World::~World() {
  world_comm_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!owns_mpi_ || finalized) {
    if (!finalized) failure_watch::stop();
    return;
  }
  // MPI_Finalize waits for every rank; a rank stuck in a collective would make it hang
  // forever. Meet at a nonblocking barrier with a deadline first. After the job failed
  // (failure_watch.h) every live rank has heard so and comes at once: wait briefly.
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  const std::chrono::milliseconds wait =
      failure_watch::job_failed() ? std::min(shutdown_timeout_, kShutdownAfterFailure) : shutdown_timeout_;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  int done = 0;
  while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%sshutdown: the other ranks did not arrive within %lld ms; aborting the job\n",
                   rank_prefix().c_str(), static_cast<long long>(wait.count()));
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  failure_watch::stop();
  MPI_Finalize();
}

void World::abort(int exit_code) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  _exit(exit_code);
}

}  // namespace parallax
