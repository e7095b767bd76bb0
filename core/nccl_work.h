// The pieces of the NCCL backend below the communicator: CUDA/NCCL return-code
// wrappers, dtype and op mapping, and NcclWork (an operation = events + deadline).
// Internal to parallax_comm (not installed); compiled only with PARALLAX_WITH_NCCL.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"

namespace parallax::detail {

/// "world rank 3, host node07": appended to CUDA/NCCL errors.
std::string nccl_where_am_i();

/// Throw CommError naming the call, file:line, the CUDA/NCCL error, host and rank.
void check_cuda(cudaError_t code, const char* call, const char* file, int line);
void check_nccl(ncclResult_t code, const char* call, const char* file, int line, ncclComm_t comm = nullptr);

#define PARALLAX_CUDA_CHECK(call) ::parallax::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define PARALLAX_NCCL_CHECK(call) ::parallax::detail::check_nccl((call), #call, __FILE__, __LINE__)
#define PARALLAX_NCCL_CHECK_COMM(call, comm) ::parallax::detail::check_nccl((call), #call, __FILE__, __LINE__, (comm))

/// Makes `device` current for the scope; restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

/// The NCCL type of `dtype`; UsageError naming the supported ones otherwise.
ncclDataType_t nccl_datatype(at::ScalarType dtype);
ncclRedOp_t nccl_op(ReduceOp op);

/// One step of a polling loop that found nothing: sched_yield for the first 64 calls,
/// then sleeps growing to 128 µs. `idle` counts the calls.
void back_off(int& idle);

/// What a communicator and its Works share; Works may outlive the communicator.
/// Guarded by `mutex`.
struct NcclShared {
  std::mutex mutex;
  ncclComm_t comm = nullptr;  ///< null once aborted or destroyed
  std::string failure;        ///< non-empty once the group is unusable
  std::string where;          ///< "on rank 1 (world rank 3, host node07, cuda:1)"
  std::function<void(CommOp, std::int64_t, std::int64_t, int)> recorder;  ///< null after destruction

  /// Aborts the NCCL communicator (its kernels stop) and fails the group.
  void fail_group_locked(const std::string& message);
};

/// One launched operation: timing events around the NCCL call on the communicator's
/// stream, a deadline, and the tensors the GPU still uses.
class NcclWork final : public Work {
 public:
  /// Creates the events on the current device (the caller makes it the group's).
  NcclWork(std::shared_ptr<NcclShared> shared,
           CommOp op,
           std::string what,
           std::int64_t bytes,
           int peer,
           std::chrono::milliseconds timeout,
           std::vector<at::Tensor> tensors);
  ~NcclWork() override;

  cudaEvent_t start_event() const { return start_; }
  cudaEvent_t done_event() const { return done_; }

  bool is_completed() override;
  /// Polls until done or the deadline; on timeout aborts the NCCL communicator.
  void wait() override;

  /// True once finished (succeeded or failed); records the counters on success.
  /// Caller holds shared->mutex.
  bool poll_locked();

 private:
  void fail_locked(const std::string& message);

  std::shared_ptr<NcclShared> shared_;
  CommOp op_;
  std::string what_;
  std::int64_t bytes_;
  int peer_;  ///< a send's or recv's group rank, -1 for a collective
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<at::Tensor> tensors_;  ///< kept alive until the GPU is done with them
  cudaEvent_t start_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool finished_ = false;
  std::string error_;
};

}  // namespace parallax::detail
