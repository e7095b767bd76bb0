// How Parallax dtypes and reductions map onto MPI. Internal to parallax_comm (not
// installed): only the MPI backend and the benchmarks see MPI types.
//
// bfloat16 has no MPI datatype and MPI's float16 support is an extension, so both
// travel as MPI_UINT16_T (two opaque bytes) and are reduced by user-defined MPI_Ops
// that widen each element to fp32, combine, and round back: once per combine, so a
// reduction over n ranks rounds n − 1 times (MPI combines pairwise).
#pragma once

#include <mpi.h>

#include <c10/core/ScalarType.h>

#include <string>

#include "parallax/core/communicator.h"

namespace parallax::detail {

/// The MPI datatype carrying one element of `dtype`. Throws UsageError naming the
/// dtype and the supported ones for anything else.
MPI_Datatype mpi_datatype(at::ScalarType dtype);

/// True for the dtypes mpi_datatype() accepts.
bool is_supported_dtype(at::ScalarType dtype);

/// The MPI error string for `code`, e.g. "MPI_ERR_TRUNCATE: message truncated".
std::string mpi_error_string(int code);

/// The reduction ops one communicator uses. Built-in MPI ops serve the native types;
/// the six half-precision ops (bf16/fp16 × sum/max/min) are created here and freed
/// by release() (not by the destructor: an op must outlive every request using it,
/// so a communicator that leaks requests leaks its ops too).
class MpiReduceOps {
 public:
  /// MPI_Op_create for the half-precision ops. MPI must be initialized.
  MpiReduceOps();
  MpiReduceOps(const MpiReduceOps&) = delete;
  MpiReduceOps& operator=(const MpiReduceOps&) = delete;

  /// The op reducing `dtype` with `op`; kAvg maps to the sum (the caller divides).
  MPI_Op get(at::ScalarType dtype, ReduceOp op) const;

  /// MPI_Op_free on the user-defined ops. Call once no request uses them.
  void release();

 private:
  // [0] bfloat16, [1] float16; then sum, max, min.
  MPI_Op half_ops_[2][3];
  bool released_ = false;
};

}  // namespace parallax::detail
