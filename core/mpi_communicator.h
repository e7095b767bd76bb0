// The MPI backend of Communicator, for host (CPU) tensors.
//
// Each MpiCommunicator owns a duplicated MPI communicator and one progress thread.
// Operations are queued in call order; the thread starts each with a nonblocking MPI
// call (MPI_Iallreduce, ...) and polls it to completion with a deadline, so
// communication progresses while the caller computes (e.g. bucket reductions during
// backward) and a peer that never joins becomes a CommError, not a hang.
//
// Supported dtypes: float32, float64, bfloat16, float16 (sum/avg/max/min reduced in
// fp32 precision per element), int32, int64, uint8. Tensors must be contiguous and on
// the CPU.
#pragma once

#include <memory>
#include <string>

#include "parallax/core/communicator.h"

namespace parallax {

/// The world group ("world"): a duplicate of MPI_COMM_WORLD. MPI must be initialized.
std::unique_ptr<Communicator> create_mpi_world_communicator();

/// Throws CommError naming `call`, the MPI error string, host and rank when
/// `code` != MPI_SUCCESS. For the few MPI calls made outside a communicator (World).
void check_mpi(int code, const char* call);

}  // namespace parallax
