// One group of ranks over two backends: CUDA tensors go to one communicator (NCCL),
// every other tensor to the other (MPI), so code written against Communicator works
// unchanged when some of its tensors live on a GPU (gradients, flat buffers) and some on
// the host (a flag, a count, an offloaded shard). That is comm.backend = "auto" with
// train.device = "cuda".
//
// Both communicators must hold the same ranks in the same order. Each keeps its own
// order: all ranks issue the same operations in the same order per backend, as they do
// anyway when every rank runs the same code. Barriers go to the host communicator;
// split() splits both (same color and key) and routes the two halves alike. The
// counters are the sum of both; the step, the default timeout and the member nodes are
// passed on.
//
//   auto world = route_by_device(std::move(mpi_world), create_nccl_communicator(*mpi, gpu, "world"));
//   world->all_reduce(cuda_gradients);   // NCCL
//   world->all_reduce(host_flags);       // MPI
#pragma once

#include <memory>

#include "parallax/core/communicator.h"

namespace parallax {

/// The group of `host` and `cuda` (same ranks, same order; UsageError otherwise), named
/// as `host`. Its backend() is "mpi+nccl" (the two backends' names joined by '+').
std::unique_ptr<Communicator> route_by_device(std::unique_ptr<Communicator> host, std::unique_ptr<Communicator> cuda);

}  // namespace parallax
