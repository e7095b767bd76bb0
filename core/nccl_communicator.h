// The NCCL backend of Communicator, for CUDA tensors. Built with PARALLAX_WITH_NCCL.
//
// One NCCL communicator per group, bootstrapped through a CPU communicator of the same
// ranks (normally the MPI one): rank 0 makes the ncclUniqueId and broadcasts it as a
// uint8 tensor, then every rank calls ncclCommInitRank.
//
// Streams. Every operation runs on the communicator's own non-blocking CUDA stream,
// which first waits on an event recorded on the producer stream: LibTorch's current
// stream when Parallax is built against CUDA LibTorch (PARALLAX_TORCH_CUDA), else the
// legacy default stream. So an operation sees everything the caller queued before it.
// Work::wait() blocks the host until the operation finished (cudaEventQuery polling);
// after it, the result may be used from any stream.
//
// Timeouts. wait() polls the completion event and ncclCommGetAsyncError until the
// deadline; on timeout (or an asynchronous NCCL error) it calls ncclCommAbort, marks
// the communicator failed and throws CommError naming op, group, bytes and rank; every
// later call throws at once. Timeouts are detected only by wait() (or is_completed()
// and later calls), not by a background thread.
//
// Point-to-point. NCCL has no tags and no buffering: send/recv run in issue order on
// the communicator's stream and a send completes only once the peer's matching recv
// runs. Ranks must therefore issue matching send/recv in compatible orders (a ring:
// even ranks send first, odd ranks receive first). Tags are range-checked, not matched.
//
// Counters: bytes as in OpCounter; nanoseconds are the operation's time on the GPU
// (between events around the NCCL call), recorded when its completion is observed.
//
//   auto nccl = parallax::create_nccl_communicator(world.communicator(), local_rank, "world");
//   nccl->all_reduce(grads)->wait();
#pragma once

#include <memory>
#include <string>

#include "parallax/core/communicator.h"

namespace parallax {

/// Creates the NCCL communicator of `bootstrap`'s ranks (same rank numbers) on CUDA
/// device `cuda_device`, named `name`, with `bootstrap`'s default timeout. Collective
/// over `bootstrap`; blocks until every rank has joined.
/// Throws CommError "no CUDA device visible ..." on a machine without a GPU (every rank
/// of the group throws, not only the one without a device), and CommError naming the
/// call, file:line, host and rank for any CUDA or NCCL error. `bootstrap` must outlive
/// the result only where NCCL lacks ncclCommSplit (< 2.18): split() re-bootstraps then.
std::unique_ptr<Communicator> create_nccl_communicator(Communicator& bootstrap,
                                                       int cuda_device,
                                                       const std::string& name);

}  // namespace parallax
