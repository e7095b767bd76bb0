// NcclCommunicator: see nccl_communicator.h for the contract (streams, timeouts, p2p).
#include "parallax/core/nccl_communicator.h"

#include <ATen/ATen.h>

#ifdef PARALLAX_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/core/logging.h"
#include "parallax/core/nccl_work.h"

namespace parallax {
namespace {

using Clock = std::chrono::steady_clock;
using detail::back_off;
using detail::DeviceGuard;
using detail::nccl_datatype;
using detail::nccl_op;
using detail::NcclShared;
using detail::NcclWork;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(
      ncclComm_t comm, int device, std::string name, std::chrono::milliseconds default_timeout, Communicator* bootstrap)
      : shared_(std::make_shared<NcclShared>()), device_(device), name_(std::move(name)), bootstrap_(bootstrap) {
    shared_->comm = comm;
    PARALLAX_NCCL_CHECK_COMM(ncclCommUserRank(comm, &rank_), comm);
    PARALLAX_NCCL_CHECK_COMM(ncclCommCount(comm, &size_), comm);
    set_default_timeout(default_timeout);
    shared_->where = detail::concat("on rank ", rank_, " (", detail::nccl_where_am_i(), ", cuda:", device_, ")");
    shared_->recorder = [this](CommOp op, std::int64_t bytes, std::int64_t ns, int peer) {
      record(op, bytes, ns, peer);
    };
    DeviceGuard guard(device_);
    PARALLAX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PARALLAX_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    PARALLAX_CUDA_CHECK(cudaMalloc(&barrier_buffer_, sizeof(float)));
    PARALLAX_CUDA_CHECK(cudaMemset(barrier_buffer_, 0, sizeof(float)));
  }

  ~NcclCommunicator() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    // Let outstanding operations finish for a bounded grace period, then abort.
    const auto give_up = Clock::now() + std::chrono::seconds(5);
    int idle = 0;
    while (sweep_locked() && Clock::now() < give_up) {
      back_off(idle);
    }
    if (shared_->comm != nullptr) {
      if (outstanding_.empty()) {
        ncclCommDestroy(shared_->comm);
      } else {
        Logger(LogLevel::kWarn)
            .warn("NCCL communicator '", name_, "' destroyed with ", outstanding_.size(), " unfinished operation(s) ",
                  shared_->where, "; aborting it");
        ncclCommAbort(shared_->comm);
      }
      shared_->comm = nullptr;
    }
    shared_->recorder = nullptr;
    if (shared_->failure.empty()) {
      shared_->failure = "the communicator was destroyed";
    }
    cudaFree(barrier_buffer_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }

  WorkPtr all_reduce(at::Tensor& tensor, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kAllReduce;
    check_tensor(op, tensor, "tensor");
    check_reduce_op(op, tensor, options.reduce_op);
    void* data = tensor.data_ptr();
    const auto count = static_cast<std::size_t>(tensor.numel());
    const ncclDataType_t type = nccl_datatype(tensor.scalar_type());
    const ncclRedOp_t reduce = nccl_op(options.reduce_op);
    return launch(op, describe_op(op, tensor, payload_bytes(tensor)), payload_bytes(tensor), options, {tensor},
                  [=](ncclComm_t comm, cudaStream_t stream) {
                    return ncclAllReduce(data, data, count, type, reduce, comm, stream);
                  });
  }

  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kReduceScatter;
    check_tensor(op, output, "output");
    check_tensor(op, input, "input");
    check_same_dtype(op, output, input);
    check_reduce_op(op, output, options.reduce_op);
    check_shards(op, input, "input", output, "output");
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const auto count = static_cast<std::size_t>(output.numel());
    const ncclDataType_t type = nccl_datatype(output.scalar_type());
    const ncclRedOp_t reduce = nccl_op(options.reduce_op);
    return launch(op, describe_op(op, input, payload_bytes(input)), payload_bytes(input), options, {input, output},
                  [=](ncclComm_t comm, cudaStream_t stream) {
                    return ncclReduceScatter(in, out, count, type, reduce, comm, stream);
                  });
  }

  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kAllGather;
    check_tensor(op, output, "output");
    check_tensor(op, input, "input");
    check_same_dtype(op, output, input);
    check_shards(op, output, "output", input, "input");
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const auto count = static_cast<std::size_t>(input.numel());
    const ncclDataType_t type = nccl_datatype(input.scalar_type());
    return launch(
        op, describe_op(op, output, payload_bytes(output)), payload_bytes(output), options, {input, output},
        [=](ncclComm_t comm, cudaStream_t stream) { return ncclAllGather(in, out, count, type, comm, stream); });
  }

  WorkPtr broadcast(at::Tensor& tensor, int root, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kBroadcast;
    check_tensor(op, tensor, "tensor");
    check_peer(op, root, "root");
    void* data = tensor.data_ptr();
    const auto count = static_cast<std::size_t>(tensor.numel());
    const ncclDataType_t type = nccl_datatype(tensor.scalar_type());
    return launch(op, describe_op(op, tensor, payload_bytes(tensor)) + detail::concat(" from root ", root),
                  payload_bytes(tensor), options, {tensor}, [=](ncclComm_t comm, cudaStream_t stream) {
                    return ncclBroadcast(data, data, count, type, root, comm, stream);
                  });
  }

  WorkPtr send(const at::Tensor& tensor, int dst, int tag, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kSend;
    check_tensor(op, tensor, "tensor");
    check_peer(op, dst, "dst");
    PARALLAX_CHECK(tag >= 0, UsageError, error_prefix(op), "tag ", tag, " must be >= 0");
    const void* data = tensor.data_ptr();
    const auto count = static_cast<std::size_t>(tensor.numel());
    const ncclDataType_t type = nccl_datatype(tensor.scalar_type());
    return launch(op, describe_op(op, tensor, payload_bytes(tensor)) + detail::concat(" to rank ", dst),
                  payload_bytes(tensor), options, {tensor},
                  [=](ncclComm_t comm, cudaStream_t stream) { return ncclSend(data, count, type, dst, comm, stream); },
                  dst);
  }

  WorkPtr recv(at::Tensor& tensor, int src, int tag, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kRecv;
    check_tensor(op, tensor, "tensor");
    check_peer(op, src, "src");
    PARALLAX_CHECK(tag >= 0, UsageError, error_prefix(op), "tag ", tag, " must be >= 0");
    void* data = tensor.data_ptr();
    const auto count = static_cast<std::size_t>(tensor.numel());
    const ncclDataType_t type = nccl_datatype(tensor.scalar_type());
    return launch(op, describe_op(op, tensor, payload_bytes(tensor)) + detail::concat(" from rank ", src),
                  payload_bytes(tensor), options, {tensor},
                  [=](ncclComm_t comm, cudaStream_t stream) { return ncclRecv(data, count, type, src, comm, stream); },
                  src);
  }

  // One send and one receive per peer with rows to exchange, in one NCCL group (NCCL has
  // no all-to-all-v of its own).
  WorkPtr all_to_all(at::Tensor& output,
                     const std::vector<std::int64_t>& output_rows,
                     const at::Tensor& input,
                     const std::vector<std::int64_t>& input_rows,
                     const CollectiveOptions& options) override {
    const CommOp op = CommOp::kAllToAll;
    check_tensor(op, output, "output");
    check_tensor(op, input, "input");
    const std::int64_t row = check_all_to_all(output, output_rows, input, input_rows);
    const auto element = static_cast<std::size_t>(input.element_size());
    const char* in = static_cast<const char*>(input.data_ptr());
    char* out = static_cast<char*>(output.data_ptr());
    const ncclDataType_t type = nccl_datatype(input.scalar_type());
    std::int64_t sent_elsewhere = 0;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) sent_elsewhere += input_rows[q] * row * static_cast<std::int64_t>(element);
    }
    const std::vector<std::int64_t> sends = input_rows;
    const std::vector<std::int64_t> receives = output_rows;
    const int ranks = size_;
    return launch(op, describe_op(op, input, sent_elsewhere), sent_elsewhere, options, {input, output},
                  [=](ncclComm_t comm, cudaStream_t stream) {
                    ncclResult_t result = ncclGroupStart();
                    std::size_t in_at = 0;
                    std::size_t out_at = 0;
                    for (int q = 0; q < ranks && result == ncclSuccess; ++q) {
                      const auto send_count = static_cast<std::size_t>(sends[q] * row);
                      const auto recv_count = static_cast<std::size_t>(receives[q] * row);
                      if (send_count > 0) result = ncclSend(in + in_at * element, send_count, type, q, comm, stream);
                      if (result == ncclSuccess && recv_count > 0)
                        result = ncclRecv(out + out_at * element, recv_count, type, q, comm, stream);
                      in_at += send_count;
                      out_at += recv_count;
                    }
                    const ncclResult_t ended = ncclGroupEnd();
                    return result != ncclSuccess ? result : ended;
                  });
  }

  WorkPtr barrier(const CollectiveOptions& options) override {
    void* data = barrier_buffer_;
    return launch(CommOp::kBarrier, detail::concat("barrier on group '", name_, "' (", size_, " ranks)", step_suffix()),
                  0, options, {}, [=](ncclComm_t comm, cudaStream_t stream) {
                    return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm, stream);
                  });
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    PARALLAX_CHECK(color >= 0, UsageError, "split of group '", name_, "' into '", name, "': color must be >= 0, got ",
                   color);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    ncclComm_t child = nullptr;
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      check_usable_locked(detail::concat("split of group '", name_, "' into '", name, "'"));
      DeviceGuard guard(device_);
      PARALLAX_NCCL_CHECK_COMM(ncclCommSplit(shared_->comm, color, key, &child, nullptr), shared_->comm);
    }
    return std::make_unique<NcclCommunicator>(child, device_, name, default_timeout(), nullptr);
#else
    PARALLAX_CHECK(bootstrap_ != nullptr, UsageError, "split of NCCL group '", name_, "': NCCL ", NCCL_MAJOR, ".",
                   NCCL_MINOR, " lacks ncclCommSplit and this group has no bootstrap communicator");
    auto child_bootstrap = bootstrap_->split(color, key, name + "/bootstrap");
    auto child = create(*child_bootstrap, device_, name);
    child->set_default_timeout(default_timeout());
    child->owned_bootstrap_ = std::move(child_bootstrap);  // the child's own, for its splits
    return child;
#endif
  }

  static std::unique_ptr<NcclCommunicator> create(Communicator& bootstrap, int cuda_device, const std::string& name);

 private:
  using Launcher = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

  // The stream the caller's work was queued on.
  cudaStream_t producer_stream() const {
#ifdef PARALLAX_TORCH_CUDA
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
#else
    return cudaStreamLegacy;
#endif
  }

  WorkPtr launch(CommOp op,
                 std::string what,
                 std::int64_t bytes,
                 const CollectiveOptions& options,
                 std::vector<at::Tensor> tensors,
                 const Launcher& call,
                 int peer = -1) {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    check_usable_locked(what);
    sweep_locked();
    DeviceGuard guard(device_);  // events belong to the device current at creation
    auto work =
        std::make_shared<NcclWork>(shared_, op, std::move(what), bytes, peer, timeout_for(options), std::move(tensors));
    PARALLAX_CUDA_CHECK(cudaEventRecord(ready_, producer_stream()));
    PARALLAX_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    PARALLAX_CUDA_CHECK(cudaEventRecord(work->start_event(), stream_));
    PARALLAX_NCCL_CHECK_COMM(call(shared_->comm, stream_), shared_->comm);
    PARALLAX_CUDA_CHECK(cudaEventRecord(work->done_event(), stream_));
    outstanding_.push_back(work);
    return work;
  }

  // Polls outstanding operations in order (one stream: they finish in order), so that
  // counters are recorded even for Works nobody waits on. Returns true while any is
  // left. Caller holds shared_->mutex.
  bool sweep_locked() {
    while (!outstanding_.empty() && outstanding_.front()->poll_locked()) {
      outstanding_.pop_front();
    }
    return !outstanding_.empty();
  }

  void check_usable_locked(const std::string& what) const {
    PARALLAX_CHECK(shared_->failure.empty() && shared_->comm != nullptr, CommError, what,
                   ": the group is unusable since an earlier operation failed: ", shared_->failure);
  }

  std::string prefix(CommOp op) const {
    return detail::concat(to_string(op), " on group '", name_, "': ");
  }

  void check_tensor(CommOp op, const at::Tensor& tensor, const char* role) const {
    PARALLAX_CHECK(tensor.defined(), UsageError, error_prefix(op), role, " is an undefined tensor");
    PARALLAX_CHECK(tensor.is_cuda() && tensor.device().index() == device_ && tensor.layout() == at::kStrided,
                   UsageError, error_prefix(op), role, " is on ", tensor.device(),
                   "; the NCCL communicator moves dense tensors on cuda:", device_, " only");
    PARALLAX_CHECK(tensor.is_contiguous(), UsageError, error_prefix(op), role, " is not contiguous (sizes ",
                   tensor.sizes(), ", strides ", tensor.strides(), ")");
    nccl_datatype(tensor.scalar_type());  // throws for unsupported dtypes
  }

  std::shared_ptr<NcclShared> shared_;
  int device_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* barrier_buffer_ = nullptr;
  std::deque<std::shared_ptr<NcclWork>> outstanding_;  ///< launched, not yet seen finished
  Communicator* bootstrap_ = nullptr;                  ///< for split without ncclCommSplit; may be null
  std::unique_ptr<Communicator> owned_bootstrap_;      ///< a split's bootstrap, owned here
};

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& bootstrap,
                                                           int cuda_device,
                                                           const std::string& name) {
  // a. Each rank checks its device; b. all ranks agree (a rank without a GPU must not
  // leave the others waiting in the id broadcast); c. rank 0 makes the id, broadcast
  // over the bootstrap group; d. ncclCommInitRank with the bootstrap's rank numbers.
  std::string problem;
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess || count == 0) {
    cudaGetLastError();
    problem = detail::concat("no CUDA device visible on ", detail::nccl_where_am_i(), " (cudaGetDeviceCount: ",
                             code == cudaSuccess ? std::string("0 devices") : std::string(cudaGetErrorString(code)),
                             "); the NCCL communicator '", name,
                             "' needs one GPU per rank: use [comm] backend = \"mpi\" on machines without GPUs");
  } else if (cuda_device < 0 || cuda_device >= count) {
    problem = detail::concat("cuda_device ", cuda_device, " is out of range on ", detail::nccl_where_am_i(), ": ",
                             count, " CUDA device(s) visible");
  }
  at::Tensor ok = at::full({1}, problem.empty() ? 1 : 0, at::kInt);
  bootstrap.all_reduce(ok, {ReduceOp::kMin})->wait();
  PARALLAX_CHECK(problem.empty(), CommError, problem);
  PARALLAX_CHECK(ok.item<int>() == 1, CommError, "NCCL communicator '", name, "': another rank of group '",
                 bootstrap.name(), "' has no usable CUDA device (see its error)");

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  at::Tensor id_bytes = at::zeros({static_cast<std::int64_t>(sizeof(id))}, at::kByte);
  if (bootstrap.rank() == 0) {
    PARALLAX_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  bootstrap.broadcast(id_bytes, 0)->wait();
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));

  ncclComm_t comm = nullptr;
  {
    DeviceGuard guard(cuda_device);
    PARALLAX_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  }
  return std::make_unique<NcclCommunicator>(comm, cuda_device, name, bootstrap.default_timeout(), &bootstrap);
}

}  // namespace

std::unique_ptr<Communicator> create_nccl_communicator(Communicator& bootstrap,
                                                       int cuda_device,
                                                       const std::string& name) {
  return NcclCommunicator::create(bootstrap, cuda_device, name);
}

}  // namespace parallax
