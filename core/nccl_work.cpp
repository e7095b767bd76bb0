#include "parallax/core/nccl_work.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <c10/core/ScalarType.h>

#include "parallax/core/error.h"

namespace parallax::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) {
    return "unknown host";
  }
  return host;
}

}  // namespace

std::string nccl_where_am_i() {
  return concat("world rank ", process_rank(), ", host ", host_name());
}

void check_cuda(cudaError_t code, const char* call, const char* file, int line) {
  if (code == cudaSuccess) {
    return;
  }
  cudaGetLastError();  // clear the error so later calls are not blamed for it
  throw CommError(concat(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(code), " (",
                         cudaGetErrorString(code), ") on ", nccl_where_am_i()));
}

void check_nccl(ncclResult_t code, const char* call, const char* file, int line, ncclComm_t comm) {
  if (code == ncclSuccess) {
    return;
  }
  std::string detail = ncclGetErrorString(code);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') {
    detail += std::string(": ") + last;
  }
  throw CommError(concat(call, " failed at ", file, ":", line, ": ", detail, " on ", nccl_where_am_i()));
}

DeviceGuard::DeviceGuard(int device) {
  PARALLAX_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    PARALLAX_CUDA_CHECK(cudaSetDevice(device));
  }
}

DeviceGuard::~DeviceGuard() {
  cudaSetDevice(previous_);
}

ncclDataType_t nccl_datatype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kHalf:
      return ncclFloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    default:
      break;
  }
  throw UsageError(concat("dtype ", c10::toString(dtype),
                          " is not supported by the NCCL communicator; use float32, "
                          "float64, bfloat16, float16, int32, int64 or uint8"));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// Polls that found nothing: sched_yield first, then sleeps growing to 128 µs.
void back_off(int& idle) {
  if (idle < 64) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(1 << std::min(idle - 64, 7)));
  }
  ++idle;
}

void NcclShared::fail_group_locked(const std::string& message) {
  if (failure.empty()) {
    failure = message;
  }
  if (comm != nullptr) {
    ncclCommAbort(comm);
    comm = nullptr;
  }
}

NcclWork::NcclWork(std::shared_ptr<NcclShared> shared,
                   CommOp op,
                   std::string what,
                   std::int64_t bytes,
                   int peer,
                   std::chrono::milliseconds timeout,
                   std::vector<at::Tensor> tensors)
    : shared_(std::move(shared)),
      op_(op),
      what_(std::move(what)),
      bytes_(bytes),
      peer_(peer),
      timeout_(timeout),
      deadline_(Clock::now() + timeout),
      tensors_(std::move(tensors)) {
  PARALLAX_CUDA_CHECK(cudaEventCreate(&start_));
  PARALLAX_CUDA_CHECK(cudaEventCreate(&done_));
}

NcclWork::~NcclWork() {
  cudaEventDestroy(start_);
  cudaEventDestroy(done_);
}

bool NcclWork::is_completed() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return poll_locked();
}

void NcclWork::wait() {
  int idle = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      if (poll_locked()) {
        break;
      }
      if (Clock::now() >= deadline_) {
        fail_locked(concat(what_, " timed out after ", timeout_.count(), " ms ", shared_->where,
                           "; the group is now unusable"));
        shared_->fail_group_locked(error_);
        break;
      }
    }
    back_off(idle);
  }
  if (!error_.empty()) {
    throw CommError(error_);
  }
}

bool NcclWork::poll_locked() {
  if (finished_) {
    return true;
  }
  if (shared_->comm == nullptr) {
    fail_locked(what_ + " was abandoned: " +
                (shared_->failure.empty() ? std::string("the communicator was destroyed") : shared_->failure));
    return true;
  }
  const cudaError_t state = cudaEventQuery(done_);
  if (state == cudaSuccess) {
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, done_);
    if (shared_->recorder) {
      shared_->recorder(op_, bytes_, static_cast<std::int64_t>(ms * 1e6), peer_);
    }
    finished_ = true;
    tensors_.clear();
    return true;
  }
  if (state != cudaErrorNotReady) {
    cudaGetLastError();
    fail_locked(concat(what_, " failed: ", cudaGetErrorName(state), " (", cudaGetErrorString(state), ") ",
                       shared_->where, "; the group is now unusable"));
    shared_->fail_group_locked(error_);
    return true;
  }
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(shared_->comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
    fail_locked(
        concat(what_, " failed: ", ncclGetErrorString(async), " ", shared_->where, "; the group is now unusable"));
    shared_->fail_group_locked(error_);
    return true;
  }
  return false;
}

void NcclWork::fail_locked(const std::string& message) {
  if (finished_) {
    return;
  }
  finished_ = true;
  error_ = message;
  tensors_.clear();  // the communicator is aborted (its kernels stopped) or never ran them
}

}  // namespace parallax::detail
